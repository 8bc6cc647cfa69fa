"""Uploads: names that escape the job folder ('..', absolute, drive letters), writing through a
planted symlink, links out of an upload folder, size bombs and a full disk are refused with one
clear line; a job's upload folder is deleted when it ends, also when it was killed, and only
folders inside the store's uploads folder are ever deleted."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gnq_core.jobs.jobs import Job, list_jobs, start_job
from gnq_core.jobs.uploads import check_upload_tree, save_uploads, uploads_dir
from gnq_core.pipelines.settings import DemoJob, ExtractJob, TrainJob, TrainSettings, job_dict


@dataclass
class Uploaded:
    """The part of streamlit's UploadedFile that save_uploads uses."""

    name: str
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def getbuffer(self) -> memoryview:
        return memoryview(self.data)


@dataclass
class Claimed(Uploaded):
    """An upload whose announced size is ``claimed`` (a size bomb, before any byte is read)."""

    claimed: int = 0

    @property
    def size(self) -> int:
        return self.claimed


@pytest.mark.parametrize("name", ["../evil.txt", "run/../../evil.txt", "/etc/passwd", "C:/x/evil.txt",
                                  "run\\..\\..\\evil.txt", "run/./../../evil.txt", "", "."])
def test_names_that_escape_the_folder_are_refused(tmp_path, name):
    into = tmp_path / "uploads" / "job"
    with pytest.raises(ValueError, match="unsafe file name") as info:
        save_uploads([Uploaded("run/config.json", b"{}"), Uploaded(name, b"x")], into)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "uploads" / "evil.txt").exists()


def test_a_folder_upload_lands_inside_and_a_planted_symlink_is_not_followed(tmp_path):
    into = tmp_path / "uploads" / "job"
    save_uploads([Uploaded("run/epoch-1/config.json", b"{}"), Uploaded("run/data.txt", b"a\nb\n")], into)
    assert (into / "run" / "epoch-1" / "config.json").read_bytes() == b"{}"
    outside = tmp_path / "outside"
    outside.mkdir()
    (into / "run" / "linked").symlink_to(outside)
    (into / "run" / "file.txt").symlink_to(outside / "victim.txt")
    for name in ("run/linked/x.txt", "run/file.txt"):
        with pytest.raises(ValueError, match="is a link|unsafe"):
            save_uploads([Uploaded(name, b"overwrite")], into)
    assert list(outside.iterdir()) == []
    with pytest.raises(ValueError, match="outside the upload folder"):
        check_upload_tree(into)
    (into / "run" / "linked").unlink()
    (into / "run" / "file.txt").unlink()
    (into / "run" / "inner").symlink_to(into / "run" / "epoch-1")  # a link that stays inside is fine
    check_upload_tree(into)


def test_size_bombs_and_a_full_disk_are_refused_before_writing(tmp_path, monkeypatch):
    into = tmp_path / "uploads" / "job"
    files = [Uploaded(f"run/part-{i}.bin", b"\0" * 600) for i in range(3)]
    with pytest.raises(ValueError, match=r"the upload is 1,800 bytes, above the limit of 1,000 bytes"):
        save_uploads(files, into, max_total_bytes=1000)
    monkeypatch.setenv("GNQ_MAX_UPLOAD_BYTES", "1500")
    with pytest.raises(ValueError, match="GNQ_MAX_UPLOAD_BYTES"):
        save_uploads(files, into)
    assert not any(into.rglob("*.bin"))
    monkeypatch.setenv("GNQ_MAX_UPLOAD_BYTES", str(10 * 2**40))
    with pytest.raises(ValueError, match="free"):  # 9 TiB: more than any test machine has free
        save_uploads([Claimed("run/model.safetensors", b"", claimed=9 * 2**40)], into)
    save_uploads(files, into)
    assert sorted(p.name for p in (into / "run").iterdir()) == ["part-0.bin", "part-1.bin", "part-2.bin"]


def wait_for(db, status: tuple[str, ...] = ("done", "failed", "cancelled"), timeout: float = 120) -> Job:
    deadline = time.monotonic() + timeout
    while (job := list_jobs(db)[0]).status not in status:
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


@pytest.mark.slow
def test_a_jobs_upload_folder_is_deleted_when_it_ends_or_dies(tmp_path):
    db = tmp_path / "gnq.duckdb"
    keep = tmp_path / "not-an-upload"
    keep.mkdir()
    # (The folders are removed in a `finally`: the same path whether the job succeeds or fails.)
    for steps, status in (([ExtractJob(run="nope")], "failed"),):
        folder = uploads_dir(db, f"job-{status}")
        save_uploads([Uploaded("data/texts.txt", b"a text\n")], folder)
        # A job file naming a folder outside the uploads folder must not make the job delete it.
        job = start_job("r", db, steps, cleanup=[folder, keep], job_id=f"job-{status}")
        assert wait_for(db).status == status, job.log_tail()
        assert not folder.exists() and keep.exists()

    # The job's process killed outright: the next look at the jobs notices and tidies up.
    folder = uploads_dir(db, "job-killed")
    save_uploads([Uploaded("data/texts.txt", b"a text\n")], folder)
    data = tmp_path / "texts.txt"
    data.write_text("a text\n" * 50)
    long_job = TrainJob(data=str(data), out=str(tmp_path), settings=TrainSettings(epochs=99))
    job = start_job("r", db, [long_job], cleanup=[folder], job_id="job-killed")
    os.killpg(job.pid, signal.SIGKILL)
    job = wait_for(db)
    assert job.status == "failed" and not folder.exists()


def test_the_job_log_shown_is_only_ever_read_from_the_jobs_folder(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("error: the contents of a file the app must not show\n")
    job = Job(job_id="j", run="r", db=str(tmp_path / "gnq.duckdb"), steps=[job_dict(DemoJob())],
              log=str(secret))
    assert job.log_tail() == "" and job.error_line() is None
    job.log = str(job.path.with_suffix(".log"))
    Path(job.log).write_text("$ gnq job\nerror: something went wrong\n")
    assert job.error_line() == "error: something went wrong"


def test_trainer_state_an_audit_never_reads_is_not_saved(tmp_path):
    """Optimizer, scheduler and RNG state and the pickled training arguments that the
    Trainer writes beside each checkpoint are not written to disk (nor counted in its size)."""
    into = tmp_path / "up"
    names = ["run/checkpoint-5/config.json", "run/checkpoint-5/model.safetensors",
             "run/checkpoint-5/trainer_state.json", "run/checkpoint-5/optimizer.pt",
             "run/checkpoint-5/scheduler.pt",
             "run/checkpoint-5/rng_state.pth", "run/checkpoint-5/rng_state_1.pth",
             "run/checkpoint-5/training_args.bin"]
    save_uploads([Uploaded(n, b"x" * 100) for n in names], into, max_total_bytes=300)
    kept = sorted(p.name for p in (into / "run" / "checkpoint-5").iterdir())
    assert kept == ["config.json", "model.safetensors", "trainer_state.json"]
