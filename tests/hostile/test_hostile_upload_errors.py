"""Uploads that the file system refuses: a 300-character file name, a file and a
folder of the same name, a read-only folder.  Each is one ValueError line naming the file, which
the New audit page shows in its error box, instead of an uncaught OSError."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from test_hostile_uploads import Uploaded

from gnq_core.jobs import jobs
from gnq_core.jobs.uploads import save_uploads


def one_line(files: list[Uploaded], into: Path, match: str) -> str:
    with pytest.raises(ValueError, match=match) as info:
        save_uploads(files, into)
    assert "\n" not in str(info.value) and len(str(info.value)) < 200
    return str(info.value)


def test_a_300_character_file_name_is_one_line(tmp_path):
    message = one_line([Uploaded("a" * 300 + ".txt", b"x")], tmp_path / "up", "cannot save the upload")
    assert "File name too long" in message and message.startswith("a" * 40)


@pytest.mark.parametrize("names", [["run/config.json", "run/config.json/x"], ["run", "run/config.json"]])
def test_a_file_and_a_folder_of_the_same_name_is_one_line(tmp_path, names):
    one_line([Uploaded(n, b"{}") for n in names], tmp_path / "up", "cannot save the upload")


def test_any_other_os_error_is_one_line(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(jobs.os, "open", read_only)
    one_line([Uploaded("run/config.json", b"{}")], tmp_path / "up",
             r"run/config.json: cannot save the upload \(Read-only file system\)")
