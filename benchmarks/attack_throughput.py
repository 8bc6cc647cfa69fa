"""The newcomer-shaped audit, stage by stage: the attacks' cost against the gradient audit's.

    python -m benchmarks.attack_throughput prepare --work DIR      # data + 3 fine-tuned checkpoints
    python -m benchmarks.attack_throughput run --work DIR --name attack_throughput-after
    python -m benchmarks.attack_throughput stages --work DIR --audit   # each stage in CPU seconds
    python -m benchmarks.attack_throughput estimate --work DIR         # the estimate, CPU clock

``prepare`` writes the 92 texts (tests/scenario_data.py's scenario at seed 0 with 74 ordinary
lines, 4 unique texts holding a secret and 3 customer records repeated 4 times: 28 secret-like
values, 10 distinct) and fine-tunes SmolLM2-135M-Instruct on them for 3 epochs (AdamW, lr 1e-4
as the demo fine-tunes a pretrained model, batch 16, 128 tokens), saving a checkpoint per epoch.

``run`` does what a newcomer's dashboard job does, in one process: the measured estimate
(pipelines/estimate_probe.py) on the first checkpoint, ``run_audit`` over the 3 checkpoints,
then ``run_extraction`` on the last with the base model as reference, each progress stage
timed from the Reporter's stage changes.  It imports only names that exist before and after the
attacks' generation engine, so the same file runs in a worktree of either (copy it there).
The load average before and after is recorded: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from .common import write

BASE = Path.home() / ".cache" / "gnq-audit" / "models" / "smollm2-135m-instruct"
EPOCHS, LR, BATCH, LENGTH = 3, 1e-4, 16, 128


def prepare(work: Path) -> None:
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gnq_core.sources.checkpoints.save import save_checkpoint
    from gnq_core.sources.tokens import collate, encode_texts, pad_id

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.scenario_data import scenario

    work.mkdir(parents=True, exist_ok=True)
    frame = scenario(0, n_filler=74, n_secrets=4, n_records=3)
    frame.to_csv(work / "texts.csv", index=False)
    tok = AutoTokenizer.from_pretrained(BASE)
    model = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    model.train()
    ids = encode_texts(tok, frame["text"].tolist(), LENGTH)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(0)
    for epoch in range(1, EPOCHS + 1):
        order = torch.randperm(len(ids), generator=gen).tolist()
        t0 = time.perf_counter()
        for s in range(0, len(order), BATCH):
            chunk = order[s: s + BATCH]
            b = collate([ids[i] for i in chunk], chunk, pad_id(tok))
            loss = model(input_ids=b.input_ids, attention_mask=b.attention_mask, labels=b.labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        save_checkpoint(model, tok, work / "checkpoints" / f"epoch-{epoch}")
        print(f"epoch {epoch}: loss {loss.item():.3f}, {time.perf_counter() - t0:.0f} s", flush=True)


def run(work: Path, name: str, threads: int) -> None:
    torch.set_num_threads(threads)
    import importlib

    # the same file measures an older release too (copied into a worktree of it), where the
    # attacks lived under pipelines (d77ec85) and no estimate probe existed
    try:
        run_extraction = importlib.import_module("gnq_core.attacks.run").run_extraction
    except ImportError:
        run_extraction = importlib.import_module("gnq_core.pipelines.attacks.run").run_extraction
    from gnq_core.common.progress import Reporter
    from gnq_core.pipelines.audit import run_audit
    from gnq_core.pipelines.settings import AuditSettings
    from gnq_core.results.store import Store
    from gnq_core.sources import find_checkpoints, load_texts

    refs = find_checkpoints(work / "checkpoints")
    dataset = load_texts(work / "texts.csv")
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    try:
        from gnq_core.pipelines.estimate_probe import (
            estimate_lines,
            measure_estimate,
            stage_of,
            total_seconds,
        )
    except ImportError:
        lines, stage_of = [], (lambda label: label)
    else:
        est_work, probe = measure_estimate(str(refs[0].path), dataset, batch_size=BATCH, max_length=LENGTH,
                                           threads=threads, checkpoints=len(refs), reference=True)
        lines = estimate_lines(est_work, probe)
    probe_s = time.perf_counter() - t0

    spent: dict[str, float] = {}
    labels: dict[str, float] = {}
    # CPU seconds beside wall: on a shared machine wall time says how busy it was
    spent_cpu: dict[str, float] = {}
    current: list = [None, time.perf_counter(), time.process_time()]

    def close(now: float, now_cpu: float) -> None:
        if current[0] is not None:
            key = stage_of(current[0])
            spent[key] = spent.get(key, 0.0) + now - current[1]
            labels[current[0]] = labels.get(current[0], 0.0) + now - current[1]
            spent_cpu[key] = spent_cpu.get(key, 0.0) + now_cpu - current[2]

    def sink(done: int, total: int, label: str, unit: str = "") -> None:
        now, now_cpu = time.perf_counter(), time.process_time()
        if label != current[0]:
            close(now, now_cpu)
            current[0], current[1], current[2] = label, now, now_cpu

    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        with Reporter(sink=sink) as reporter:
            store = Store(Path(tmp) / "gnq.duckdb")
            settings = AuditSettings(batch_size=BATCH, max_length=LENGTH)
            info = run_audit(store, refs, dataset, name="real", settings=settings, reporter=reporter)
            audit_end, audit_end_cpu = time.perf_counter(), time.process_time()
            summary = run_extraction(store, info, reporter=reporter, reference=str(BASE))
            end, end_cpu = time.perf_counter(), time.process_time()
            secrets = store.secret_attacks(info.run_id)
            extractions = store.extractions(info.run_id)
    close(end, end_cpu)
    real_s = end - t0
    rows = [{"stage": x.stage, "what": x.what, "count": x.count, "noun": x.noun, "estimated_s": x.seconds,
             "real_s": spent.get(x.stage), "cpu_s": spent_cpu.get(x.stage)} for x in lines]
    estimated = total_seconds(lines) if lines else float("nan")
    audit_s, attack_s = audit_end - t0, end - audit_end
    audit_cpu, attack_cpu = audit_end_cpu - c0, end_cpu - audit_end_cpu
    payload = {
        "what": ("newcomer-shaped audit: SmolLM2-135M-Instruct fine-tuned 3 epochs on 92 texts (28 "
                 "secret-like values, 10 distinct), gnq audit of the 3 checkpoints then gnq extract's "
                 "default attacks on the last with the base model as reference, one process"),
        "checkpoints": len(refs), "texts": len(dataset), "threads": threads, "batch_size": BATCH,
        "max_length": LENGTH, "probe_s": probe_s, "estimated_s": estimated, "real_s": real_s,
        "ratio_real_to_estimate": real_s / estimated, "audit_stage_s": audit_s, "attack_stage_s": attack_s,
        "attack_to_audit": attack_s / audit_s, "audit_stage_cpu_s": audit_cpu,
        "attack_stage_cpu_s": attack_cpu, "attack_to_audit_cpu": attack_cpu / audit_cpu,
        "stage_cpu_s": spent_cpu, "stages": rows, "labels": labels, "cpu_s": time.process_time(),
        "summary": {k: v for k, v in summary.items() if not isinstance(v, float) or v == v},
        "results": {"secret_rows": len(secrets), "secrets_reproduced": int(secrets["reproduced"].sum()),
                    "exposures": [None if x != x else round(float(x), 6) for x in secrets["exposure"]],
                    "extraction_matches": [None if x != x else float(x)
                                           for x in extractions["match_fraction"]]},
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "note": "one process (a dashboard job's steps); imports excluded; the machine is shared"}
    print(f"CPU: audit {audit_cpu:.1f} s, attacks {attack_cpu:.1f} s ({attack_cpu / audit_cpu:.2f}×)")
    print(f"audit {audit_s:.1f} s, attacks {attack_s:.1f} s ({attack_s / audit_s:.2f}×); estimated "
          f"{estimated:.1f} s, real {real_s:.1f} s (ratio {real_s / estimated:.2f}), probe {probe_s:.1f} s")
    for r in rows:
        print(f"  {r['stage']:14s} est {r['estimated_s']:7.1f} s  real {r['real_s'] or 0:7.1f} s")
    print(write(name, payload))


def stages(work: Path, name: str, threads: int, nulls: int, audit: bool) -> None:
    """Each attack stage once, in CPU seconds of this process (steady on a shared machine, where
    the whole run's wall time is not), on the last checkpoint with the base model as reference:
    the text windows, membership and discoverable passes, the secret values' decoding, and the
    exposures of one value of each kind (all its copies) with ``nulls`` never-trained values per
    format, under the audited model; then the whole attack stage projected from the per-value
    costs (each distinct digit value under both models, every format's 20 never-trained values).
    With ``audit``, one checkpoint's gradient audit and the measured estimate too, its clock in CPU
    seconds (that code is the same before and after)."""
    import inspect

    torch.set_num_threads(threads)
    import gnq_core.attacks.secret_exposure as se
    from gnq_core.attacks.discoverable import suffix_logprob
    from gnq_core.attacks.exposure import value_space
    from gnq_core.attacks.extraction import extraction_attack
    from gnq_core.attacks.membership import token_logprobs
    from gnq_core.attacks.secret_attack import attack_secrets, format_places_of, secret_targets
    from gnq_core.sources import find_checkpoints, load_texts
    from gnq_core.sources.checkpoints.load import load_checkpoint
    from gnq_core.sources.tokens import encode_texts, pad_id

    refs = find_checkpoints(work / "checkpoints")
    dataset = load_texts(work / "texts.csv")
    texts = list(dataset.texts)
    model, tok = load_checkpoint(str(refs[-1].path))
    reference, _ = load_checkpoint(str(BASE))
    model.eval(), reference.eval()
    ids = encode_texts(tok, texts, LENGTH)
    pad, eids = pad_id(tok), list(range(len(texts)))
    cpu: dict[str, float] = {}

    def timed(key: str, fn):
        t0 = time.process_time()
        out = fn()
        cpu[key] = time.process_time() - t0
        return out

    kw = dict(prefix_tokens=12, suffix_tokens=8, batch_size=32)
    if "reference" in inspect.signature(extraction_attack).parameters:
        timed("text windows", lambda: extraction_attack(model, tok, ids, eids, reference=reference, **kw))
    else:
        timed("text windows", lambda: [extraction_attack(m, tok, ids, eids, **kw)
                                       for m in (reference, model)])
    timed("membership", lambda: [token_logprobs(m, ids, pad, 32) for m in (model, reference)])
    timed("discoverable", lambda: suffix_logprob(model, ids, 12, 8, pad, batch_size=32))
    timed("secret decode", lambda: attack_secrets(model, tok, texts, eids, ids, reference=reference,
                                                  n_candidates=1, max_length=LENGTH))

    # the exposures: one value of each kind (its copies), templates from all the run's values
    targets = secret_targets(tok, texts, eids, ids)
    by_kind: dict[str, set[str]] = {}
    for t in targets:
        by_kind.setdefault(t.kind, set()).add(t.value)
    places = {k: format_places_of(v) for k, v in by_kind.items()}
    spaces = {(t.kind, t.value): value_space(t.value, t.kind, places[t.kind][t.value]) for t in targets}
    digit_values = [k for k, s in spaces.items() if s is not None]
    formats = {(k[0], s.template) for k, s in spaces.items() if s is not None}
    picked = {kind: min(v for k, v in digit_values if k == kind) for kind, _ in digit_values}
    chosen = [t for t in targets if picked.get(t.kind) == t.value]
    occurrences = [se.Occurrence(t.example_id, t.value_start, t.kind, t.value, tuple(t.prompt_ids),
                                 texts[t.example_id][t.prompt_chars: t.value_start],
                                 frozenset(places[t.kind][t.value])) for t in chosen]
    calls: list[dict] = []
    real = se.exposure

    def counted(m, *args, **kwargs):
        t0, w0 = time.process_time(), time.perf_counter()
        out = real(m, *args, **kwargs)
        calls.append({"model": "audited" if m is model else "reference", "value": args[3].value,
                      "kind": kind_of.get(args[3].template),
                      "cpu_s": time.process_time() - t0, "wall_s": time.perf_counter() - w0,
                      "method": out.method, "nodes": out.nodes})
        return out

    kind_of = {template: kind for kind, template in formats}
    se.exposure, se.NULL_VALUES = counted, nulls
    values_by_kind = {k: set(v) for k, v in by_kind.items()}
    settings = se.Settings(128, 1024, 0, 32, LENGTH)
    t0 = time.process_time()
    # the reference's exposures cost as the audited model's (a value after a prompt of its own each):
    # on a loaded machine they are projected from those, not measured
    se.run_exposures(model, None, tok, occurrences, values_by_kind, settings)
    cpu["exposure (measured subset)"] = time.process_time() - t0
    n_first = len(picked)
    first, null = calls[:n_first], calls[n_first:]
    def mean(xs: list[dict], kind: str) -> float:
        xs = [x["cpu_s"] for x in xs if x["kind"] == kind]
        return sum(xs) / len(xs)

    kinds = sorted(picked)
    projected = {"distinct digit values": len(digit_values), "formats": len(formats),
                 "per value (own prompt) cpu_s": {k: mean(first, k) for k in kinds},
                 "per never-trained value cpu_s": {k: mean(null, k) for k in kinds},
                 "exposure cpu_s": sum(2 * sum(1 for kk, _ in digit_values if kk == k) * mean(first, k)
                                       + 20 * sum(1 for kk, _ in formats if kk == k) * mean(null, k)
                                       for k in kinds)}
    projected["attack stage cpu_s"] = projected["exposure cpu_s"] + sum(
        v for k, v in cpu.items() if not k.startswith("exposure"))
    payload = {"what": "attack stages in CPU seconds of one process (one thread), the exposure projected",
               "threads": threads, "nulls_measured_per_format": nulls, "cpu_s": cpu,
               "exposure_calls": calls, "projected": projected}
    if audit:
        from gnq_core.pipelines.audit import run_audit
        from gnq_core.pipelines.estimate_probe import estimate_lines, measure_estimate
        from gnq_core.pipelines.settings import AuditSettings
        from gnq_core.results.store import Store

        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "gnq.duckdb")
            t0 = time.process_time()
            run_audit(store, [refs[0]], dataset, name="one", settings=AuditSettings(batch_size=BATCH,
                                                                                    max_length=LENGTH))
            payload["audit one checkpoint cpu_s"] = time.process_time() - t0
        # the probe's clock reads CPU seconds too, as the audit's beside it (wall time on a shared
        # machine says how busy it was)
        wall, time.perf_counter = time.perf_counter, time.process_time
        t0 = time.process_time()
        try:
            est_work, probe = measure_estimate(str(refs[0].path), dataset, batch_size=BATCH,
                                               max_length=LENGTH, threads=threads, checkpoints=len(refs),
                                               reference=True)
        finally:
            time.perf_counter = wall
        payload["probe cpu_s"] = time.process_time() - t0
        payload["estimate"] = [{"stage": x.stage, "seconds": x.seconds, "count": x.count,
                                "assumed": x.assumed} for x in estimate_lines(est_work, probe)]
    payload["load_average_after"] = os.getloadavg()
    print(json.dumps({"cpu_s": cpu, "projected": projected}, indent=1))
    print(write(name, payload))


def estimate(work: Path, name: str, threads: int) -> None:
    """The measured estimate of the whole run with its clock reading this process's CPU seconds,
    to set beside ``stages`` (CPU seconds too) on a shared machine, where wall time says how busy
    the machine was more than what the work costs."""
    import gnq_core.pipelines.estimate_probe as probe_module
    from gnq_core.pipelines.estimate_probe import estimate_lines, measure_estimate, total_seconds
    from gnq_core.sources import find_checkpoints, load_texts

    torch.set_num_threads(threads)
    probe_module.time.perf_counter = time.process_time
    refs = find_checkpoints(work / "checkpoints")
    t0 = time.process_time()
    w, probe = measure_estimate(str(refs[0].path), load_texts(work / "texts.csv"), batch_size=BATCH,
                                max_length=LENGTH, threads=threads, checkpoints=len(refs), reference=True)
    lines = estimate_lines(w, probe)
    payload = {"what": "the estimate in CPU seconds (the probe's clock patched to process_time)",
               "probe_cpu_s": time.process_time() - t0, "total_s": total_seconds(lines),
               "lines": [{"stage": x.stage, "seconds": x.seconds, "assumed": x.assumed} for x in lines],
               "load_average_after": os.getloadavg()}
    print(json.dumps(payload, indent=1))
    print(write(name, payload))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["prepare", "run", "stages", "estimate"])
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--name", default="attack_throughput")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--nulls", type=int, default=4, help="stages: never-trained values per format")
    parser.add_argument("--audit", action="store_true", help="stages: one audit and the estimate")
    args = parser.parse_args()
    if args.step == "prepare":
        torch.set_num_threads(args.threads)
        prepare(args.work)
    elif args.step == "stages":
        stages(args.work, args.name, args.threads, args.nulls, args.audit)
    elif args.step == "estimate":
        estimate(args.work, args.name, args.threads)
    else:
        run(args.work, args.name, args.threads)


if __name__ == "__main__":
    main()
