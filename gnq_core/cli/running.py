"""``gnq train``, ``audit``, ``extract``, ``demo`` and ``job``: each parses its options into a job's settings
(pipelines/settings.py) and hands them to ``run_job``."""

from __future__ import annotations

from pathlib import Path

import typer

from gnq_core.attacks.defaults import MAX_SECRET_CANDIDATES, MIN_SECRET_CANDIDATES, PROTOCOL_PRESETS
from gnq_core.cli.command import (
    CpuThreadsOption,
    DataFormatOption,
    DbOption,
    DeviceOption,
    GroupColumnOption,
    LamModeOption,
    LossOption,
    MaxLengthOption,
    PublicColumnOption,
    QuietOption,
    SecretColumnOption,
    SecretPatternOption,
    TextColumnOption,
    TrainOnOption,
    app,
    console,
    open_store,
    run_and_tell,
    user_errors,
)
from gnq_core.pipelines.options import audit_job
from gnq_core.pipelines.settings import AuditSettings, DemoJob, ExtractJob, TrainJob, TrainSettings


@app.command()
@user_errors
def train(
    data: Path = typer.Option(..., help="Training texts: .txt (one per line), .jsonl, .csv or .parquet."),
    out: Path = typer.Option(..., help="Run folder; a checkpoint is saved per epoch in OUT/epoch-K."),
    init: Path = typer.Option(None, help="Fine-tune this Hugging Face checkpoint folder."),
    from_scratch: bool = typer.Option(False, "--from-scratch",
                                      help="Train a BPE tokenizer on the data and a fresh GPT-2."),
    preset: str = typer.Option(TrainSettings.preset, help="Model size with --from-scratch: tiny or small."),
    epochs: int = typer.Option(TrainSettings.epochs, help="Passes over the data."),
    batch_size: int = typer.Option(TrainSettings.batch_size,
                                   help="Examples per step (also the GNQ batch; at least 2)."),
    lr: float = typer.Option(TrainSettings.lr, help="AdamW learning rate."),
    lam: float = typer.Option(TrainSettings.lam, help="GNQ regulariser λ (> 0)."),
    lam_mode: str = LamModeOption,
    loss: str = LossOption,
    max_length: int = MaxLengthOption,
    seed: int = typer.Option(TrainSettings.seed, help="Seed for initialisation, shuffling and dropout."),
    vocab_size: int = typer.Option(TrainSettings.vocab_size,
                                   help="Tokenizer vocabulary with --from-scratch."),
    text_column: str = TextColumnOption,
    group_column: str = GroupColumnOption,
    secret_column: str = SecretColumnOption,
    secret_pattern: list[str] = SecretPatternOption,
    public_column: str = PublicColumnOption,
    name: str = typer.Option(None, help="Run name (default: the OUT folder's name)."),
    db: Path = DbOption,
    device: str = DeviceOption,
    dtype: str = typer.Option(TrainSettings.dtype, help="float32 or float64."),
    threads: int = CpuThreadsOption,
    quiet: bool = QuietOption,
) -> None:
    """Train or fine-tune a causal LM with in-run GNQ on every step, saving a checkpoint per epoch."""
    if (init is None) == (not from_scratch):
        raise ValueError("give exactly one of --init CHECKPOINT_DIR or --from-scratch")
    settings = TrainSettings(epochs=epochs, batch_size=batch_size, lr=lr, lam=lam, max_length=max_length,
                             seed=seed, preset=preset, vocab_size=vocab_size, device=device, dtype=dtype,
                             loss=loss, lam_mode=lam_mode)
    run_and_tell(TrainJob(data=str(data), out=str(out), init=str(init) if init else None, name=name,
                            text_column=text_column, group_column=group_column, settings=settings,
                            secret_column=secret_column, secret_patterns=tuple(secret_pattern or ()),
                            public_column=public_column, threads=threads), db, quiet)


@app.command()
@user_errors
def audit(
    checkpoints: Path = typer.Option(..., help="A checkpoint folder, or a folder of them "
                                               "(epoch-*, checkpoint-*, step-*, ...)."),
    data: Path = typer.Option(..., help="The texts to audit: .txt, .jsonl, .csv or .parquet."),
    name: str = typer.Option(None, help="Run name (default: the checkpoints folder's name)."),
    lam: float = typer.Option(AuditSettings.lam, help="GNQ regulariser λ (> 0)."),
    lam_mode: str = LamModeOption,
    loss: str = LossOption,
    batch_size: int = typer.Option(AuditSettings.batch_size, show_default=False,
                                   help="Examples per GNQ batch (≥ 2; GNQ is relative to the batch). "
                                        "Default: the largest up to 16 that the memory plan fits on the "
                                        "device."),
    max_length: int = MaxLengthOption,
    seed: int = typer.Option(AuditSettings.seed,
                             help="Seed of the batch partition (the same for every checkpoint)."),
    text_column: str = TextColumnOption,
    data_format: str = DataFormatOption,
    train_on: str = TrainOnOption,
    group_column: str = GroupColumnOption,
    secret_column: str = SecretColumnOption,
    secret_pattern: list[str] = SecretPatternOption,
    public_column: str = PublicColumnOption,
    db: Path = DbOption,
    device: str = DeviceOption,
    dtype: str = typer.Option(AuditSettings.dtype,
                              help="auto (as the weights are stored: a bf16 checkpoint computed in bf16 as "
                                   "trained, its Grams in float32, approximate), float32 or float64 (exact "
                                   "to float64 rounding; upcasts bf16/fp16 weights), bfloat16 or float16."),
    non_members: Path = typer.Option(None, "--non-members", show_default=False,
                                     help="Texts the model never saw: audited over the same checkpoints into "
                                          "run NAME.non-members (membership ground truth)."),
    reference: str = typer.Option(None, show_default=False,
                                  help="With --non-members: 'first' (the first checkpoint) or a model folder "
                                       "(a fine-tune's base) whose loss calibrates the loss ratio."),
    threads: int = CpuThreadsOption,
    tokenizer: Path = typer.Option(None, help="Read the tokenizer from this folder (checkpoints saved "
                                              "without one; Trainer(..., processing_class=tokenizer) "
                                              "saves it)."),
    base_model: Path = typer.Option(None, "--base-model", show_default=False,
                                    help="The checkpoints are PEFT adapters (adapter_config.json, e.g. a "
                                         "Trainer run of a LoRA model): the model folder they were trained "
                                         "from. GNQ is over the adapter's parameters, as in-run."),
    merge_adapter: bool = typer.Option(False, "--merge-adapter",
                                       help="With --base-model: GNQ over all parameters of the merged model "
                                            "instead of the adapter's (not comparable with in-run GNQ)."),
    companions: str = typer.Option(None, "--companions", show_default=False, metavar="N|all",
                                   help="GNQ of each text against N other texts of the data, or 'all' of "
                                        "them, through seeded sketches of the gradients (DESIGN.md §9), "
                                        "instead of against its batch; --batch-size is then the texts per "
                                        "pass."),
    sketch_k: int = typer.Option(AuditSettings.sketch_k, "--sketch-k",
                                 help="With --companions: sketch dimensions per weight matrix."),
    sketch_total: int = typer.Option(AuditSettings.sketch_total, "--sketch-total", min=1, show_default=False,
                                     help="With --companions: m, the dimensions each text's sketch is folded "
                                          "into (default 16,384 with 'all': its m × m system is 2 GiB, and "
                                          "more texts than m are streamed in two passes; else 65,536)."),
    shard_model: bool = typer.Option(False, "--shard-model",
                                     help="Under torchrun: shard each checkpoint over the ranks (FSDP2, one "
                                          "unit per transformer block and the root), so each holds 1/N of "
                                          "it; the same rows. Per-batch audits of plain checkpoints only."),
    quiet: bool = QuietOption,
) -> None:
    """GNQ, loss and self-influence of every text at every checkpoint; reruns resume.

    Under ``torchrun --nproc-per-node N gnq audit ...`` the ranks share each checkpoint's
    batches and rank 0 writes the rows (the same rows as one process); ``--shard-model`` shards
    each checkpoint over the ranks (FSDP2) so each holds 1/N of it."""
    job = audit_job(checkpoints=checkpoints, data=data, name=name, lam=lam, lam_mode=lam_mode, loss=loss,
                    batch_size=batch_size, max_length=max_length, seed=seed, device=device, dtype=dtype,
                    companions=companions, sketch_k=sketch_k, sketch_total=sketch_total,
                    text_column=text_column, group_column=group_column, secret_column=secret_column,
                    secret_patterns=secret_pattern, public_column=public_column, threads=threads,
                    data_format=data_format, train_on=train_on, tokenizer=tokenizer, base_model=base_model,
                    merge_adapter=merge_adapter, shard_model=shard_model,
                    non_members=non_members, reference=reference)
    run_and_tell(job, db, quiet)


@app.command()
@user_errors
def estimate(
    checkpoints: Path = typer.Option(..., help="The checkpoints to audit, as for gnq audit."),
    data: Path = typer.Option(..., help="The texts to audit, as for gnq audit."),
    name: str = typer.Option(None, help="As for gnq audit."),
    lam: float = typer.Option(AuditSettings.lam, help="As for gnq audit."),
    lam_mode: str = LamModeOption,
    loss: str = LossOption,
    batch_size: int = typer.Option(AuditSettings.batch_size, show_default=False,
                                   help="Examples per GNQ batch, as for gnq audit (default: the memory "
                                        "plan's)."),
    max_length: int = MaxLengthOption,
    seed: int = typer.Option(AuditSettings.seed, help="Seed of the batch partition, as for gnq audit."),
    text_column: str = TextColumnOption,
    group_column: str = GroupColumnOption,
    data_format: str = DataFormatOption,
    train_on: str = TrainOnOption,
    secret_column: str = SecretColumnOption,
    secret_pattern: list[str] = SecretPatternOption,
    public_column: str = PublicColumnOption,
    dtype: str = typer.Option(AuditSettings.dtype, help="As for gnq audit."),
    non_members: Path = typer.Option(None, "--non-members", show_default=False, help="As for gnq audit."),
    tokenizer: Path = typer.Option(None, help="As for gnq audit."),
    base_model: Path = typer.Option(None, "--base-model", show_default=False,
                                    help="As for gnq audit: the checkpoints are PEFT adapters of this "
                                         "model."),
    merge_adapter: bool = typer.Option(False, "--merge-adapter", help="As for gnq audit."),
    shard_model: bool = typer.Option(False, "--shard-model",
                                     help="As for gnq audit (what it refuses with it, refused here); the "
                                          "probe runs in one process holding the whole model."),
    companions: str = typer.Option(None, "--companions", show_default=False, metavar="N|all",
                                   help="As for gnq audit (its memory is checked; its time is not estimated "
                                        "yet)."),
    sketch_k: int = typer.Option(AuditSettings.sketch_k, "--sketch-k", help="As for gnq audit."),
    sketch_total: int = typer.Option(AuditSettings.sketch_total, "--sketch-total", min=1, show_default=False,
                                     help="As for gnq audit."),
    attack: bool = typer.Option(True, "--attack/--no-attack",
                                help="Include gnq extract's stages (text windows, secret values, exposure)."),
    reference: str = typer.Option(ExtractJob.reference,
                                  help="As for gnq extract: 'first', a model folder, or 'none' (no reference "
                                       "model stages); with --non-members, as for gnq audit."),
    prefix_tokens: int = typer.Option(ExtractJob.prefix_tokens, help="As for gnq extract (p)."),
    suffix_tokens: int = typer.Option(ExtractJob.suffix_tokens, help="As for gnq extract (s)."),
    threshold: float = typer.Option(ExtractJob.threshold, help="As for gnq extract."),
    attack_batch_size: int = typer.Option(ExtractJob.batch_size, "--attack-batch-size",
                                          help="gnq extract's --batch-size: texts decoded together."),
    secret_candidates: int = typer.Option(ExtractJob.secret_candidates, help="As for gnq extract."),
    exposure_nodes: int = typer.Option(ExtractJob.exposure_nodes, help="As for gnq extract."),
    preset: str = typer.Option(None, show_default=False, help="As for gnq extract."),
    threads: int = CpuThreadsOption,
    device: str = DeviceOption,
) -> None:
    """How long gnq audit and gnq extract will take here: a short probe times each kind of work once
    on the first checkpoint (an audit batch, a decoding batch, a scoring pass, a secret value's
    exposure) and multiplies by each stage's count, every assumption stated.  It takes every option
    gnq audit takes and gnq extract's, and refuses what they refuse (pipelines/preflight.py)."""
    import torch

    from gnq_core.pipelines.estimate_probe import describe, estimate_lines, measure_estimate
    from gnq_core.pipelines.preflight import audit_inputs, extract_options

    if preset is not None:
        if preset not in PROTOCOL_PRESETS:
            raise ValueError(f"--preset must be one of {', '.join(PROTOCOL_PRESETS)}, not {preset!r}")
        prefix_tokens, suffix_tokens = PROTOCOL_PRESETS[preset]
    job = audit_job(checkpoints=checkpoints, data=data, name=name, lam=lam, lam_mode=lam_mode, loss=loss,
                    batch_size=batch_size, max_length=max_length, seed=seed, device=device, dtype=dtype,
                    companions=companions, sketch_k=sketch_k, sketch_total=sketch_total,
                    text_column=text_column, group_column=group_column, secret_column=secret_column,
                    secret_patterns=secret_pattern, public_column=public_column, threads=threads,
                    tokenizer=tokenizer, base_model=base_model, merge_adapter=merge_adapter,
                    shard_model=shard_model, non_members=non_members,
                    reference=reference if non_members else None, data_format=data_format, train_on=train_on)
    attack_job = extract_options(prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens,
                                 threshold=threshold, batch_size=attack_batch_size,
                                 device=device, reference=reference,
                                 secret_candidates=secret_candidates, exposure_nodes=exposure_nodes,
                                 threads=threads)
    inputs = audit_inputs(job)
    refs = inputs.refs
    calibrated = attack_job.reference is not None and (attack_job.reference != "first" or len(refs) > 1)
    work, probe = measure_estimate(str(refs[0].path), inputs.dataset, batch_size=job.settings.batch_size,
                                   max_length=job.settings.max_length, seed=job.settings.seed,
                                   threads=threads or torch.get_num_threads(), attack=attack,
                                   reference=calibrated, prefix=attack_job.prefix_tokens,
                                   suffix=attack_job.suffix_tokens, attack_batch=attack_job.batch_size,
                                   secret_candidates=attack_job.secret_candidates,
                                   exposure_nodes=attack_job.exposure_nodes, checkpoints=len(refs),
                                   tokenizer=job.tokenizer, device=device, adapters=inputs.adapters,
                                   dtype=job.settings.dtype)
    console.print(describe(estimate_lines(work, probe), probe), markup=False, highlight=False, soft_wrap=True)


@app.command()
@user_errors
def extract(
    run: str = typer.Option(..., help="Run name or id."),
    checkpoint: str = typer.Option(None, help="Checkpoint label to attack (default: the last)."),
    prefix_tokens: int = typer.Option(ExtractJob.prefix_tokens,
                                      help="Tokens of each text revealed to the model (p)."),
    suffix_tokens: int = typer.Option(ExtractJob.suffix_tokens,
                                      help="Tokens that must follow exactly (s); texts shorter than p + s "
                                           "are not attackable."),
    threshold: float = typer.Option(ExtractJob.threshold,
                                    help="Reproduced when this share of the s tokens matches (1: exactly)."),
    reference: str = typer.Option(ExtractJob.reference,
                                  help="Reference model: 'first' (the run's first checkpoint), a checkpoint "
                                       "folder (for a fine-tune, its base), or 'none'. A text the reference "
                                       "also reproduces is not extracted."),
    batch_size: int = typer.Option(ExtractJob.batch_size, help="Texts decoded together."),
    secret_candidates: int = typer.Option(ExtractJob.secret_candidates,
                                          help="Random values of a digit secret's space scored beside it "
                                               "when its exact rank is out of reach: its exposure is then "
                                               "estimated from their likelihoods (1: no exposure; at "
                                               f"least {MIN_SECRET_CANDIDATES}, at most "
                                               f"{MAX_SECRET_CANDIDATES:,})."),
    exposure_nodes: int = typer.Option(ExtractJob.exposure_nodes,
                                       help="Token prefixes the exact-rank search of a digit secret may "
                                            "expand before its exposure is estimated instead."),
    preset: str = typer.Option(None, show_default=False,
                               help="(p, s) of a protocol to compare with, instead of --prefix-tokens/"
                                    "--suffix-tokens: 12/8 (this tool's default), 32/32 (Pythia's "
                                    "memorisation studies), 50/50 (Carlini et al.'s extraction benchmark)."),
    non_members: Path = typer.Option(None, "--non-members", show_default=False,
                                     help="Texts the model never saw (an audit run only): audited over its "
                                          "checkpoints into run NAME.non-members; the reference's loss of "
                                          "both."),
    db: Path = DbOption,
    device: str = DeviceOption,
    threads: int = CpuThreadsOption,
    quiet: bool = QuietOption,
) -> None:
    """Calibrated extraction attack: reveal each text's first p tokens, greedy-decode s more; extracted
    when they match exactly and the reference model does not produce them too."""
    if preset is not None:
        if preset not in PROTOCOL_PRESETS:
            raise ValueError(f"--preset must be one of {', '.join(PROTOCOL_PRESETS)}, not {preset!r}")
        prefix_tokens, suffix_tokens = PROTOCOL_PRESETS[preset]
    from gnq_core.pipelines.preflight import extract_options

    run_and_tell(extract_options(run=run, checkpoint=checkpoint, prefix_tokens=prefix_tokens,
                                 threshold=threshold, batch_size=batch_size, device=device,
                                 suffix_tokens=suffix_tokens, reference=reference,
                                 non_members=str(non_members) if non_members else None,
                                 secret_candidates=secret_candidates, exposure_nodes=exposure_nodes,
                                 threads=threads), db, quiet)


@app.command()
@user_errors
def demo(
    db: Path = DbOption,
    out: Path = typer.Option(None, help="Folder for the demo's checkpoints (default: beside the store)."),
    epochs: int = typer.Option(None, show_default=False,
                               help="Training epochs of the demo model (default 12; 2 with --model)."),
    model: str = typer.Option(None, show_default=False,
                              help="smollm2: fine-tune the real SmolLM2-135M (gnq model fetch) instead of "
                                   "pretraining a tiny model; on one CPU thread roughly 15 minutes an epoch "
                                   "(451 texts; a GPU takes seconds)."),
    device: str = DeviceOption,
    quiet: bool = QuietOption,
    background: bool = typer.Option(False, "--background", help="Start it as a dashboard job and return at "
                                    "once (its progress shows on the Runs page); nothing when it is built."),
) -> None:
    """Build the demo run end to end from data/demo.csv: train a tiny model, audit, extract."""

    epochs = epochs if epochs is not None else (DemoJob.epochs if model is None else 2)
    job = DemoJob(out=str(out) if out else None, epochs=epochs, device=device, model=model)
    if background:
        from gnq_core.jobs.demo_job import start_demo_job

        console.print(start_demo_job(open_store(db), job), soft_wrap=True, highlight=False)
        return
    run_and_tell(job, db, quiet)


@app.command()
@user_errors
def job(
    file: Path = typer.Argument(..., help="A job file written by the dashboard (gnq_core.jobs)."),
    step: int = typer.Option(0, min=0, help="Which of its steps to run."),
    db: Path = DbOption,
    quiet: bool = QuietOption,
) -> None:
    """Run one step of a dashboard job: its settings are read from the job file, not a command line."""
    from gnq_core.jobs.jobs import Job

    run_and_tell(Job.load(file).settings(step), db, quiet)
