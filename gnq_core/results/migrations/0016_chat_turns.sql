-- Schema version 16: a chat text's layout as JSON (sources/chat.py ChatLayout): its turns (role,
-- content's characters in the rendered text, trained), the runs of token positions that carried the
-- loss, and the characters the chat template wrote.  NULL: a plain text (every token trained).
ALTER TABLE examples ADD COLUMN turns VARCHAR;
-- The turn an extraction window was taken in (system / user / assistant; NULL: a plain text) and
-- whether that turn carried the loss (attacks/windows.py).
ALTER TABLE extractions ADD COLUMN turn VARCHAR;
ALTER TABLE extractions ADD COLUMN turn_trained BOOLEAN;
