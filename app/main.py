"""`streamlit run app/main.py`: the dashboard (gnq_core/dashboard/), started from the checkout.
`gnq dashboard` serves the same behind its HTTP gate; .streamlit/ here links to the package's config."""

from gnq_core.dashboard.main import main

main()
