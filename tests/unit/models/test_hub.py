"""GGUFs from the Hugging Face Hub through `huggingface_hub`, against a fake Hub on loopback: which file is picked,
what reaches the library's cache, and what happens when the Hub cannot be reached."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_hub import FakeHub, File, fake_hub, hub_env, point_library_at
from servers import server_env
from tiny_bert import write_tiny_bert

from tokenrelay.cli.pull import run_pull
from tokenrelay.models.hub import HubUnavailable, NotOnHub, chat_template_from_repo, choose_files, model_file
from tokenrelay.models.source import parse_source

REPO = "test-org/tiny-GGUF"
SOURCE = f"hf:{REPO}"
TEMPLATES = [{"name": "default", "template": "{{ messages }}"}, {"name": "tool_use", "template": "{{ tools }}"}]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def repos(gguf: Path) -> dict[str, dict[str, File]]:
    tiny = {
        "README.md": b"# tiny",
        "mmproj-tiny-Q4_K_M.gguf": b"a projector, never a model",
        "tiny-F16-00001-of-00002.gguf": b"first part",
        "tiny-F16-00002-of-00002.gguf": b"second part",
        "tiny-Q4_K_M.gguf": gguf,
        "tiny-Q8_0.gguf": gguf.read_bytes()[:1000],
        "tokenizer_config.json": json.dumps({"chat_template": TEMPLATES}).encode(),
    }
    plain = {"plain.gguf": b"GGUF", "tokenizer_config.json": b'{"chat_template": "{{ bos_token }}"}'}
    return {REPO: tiny, "test-org/plain": plain, "test-org/bare": {"bare.gguf": b"GGUF"}}


@pytest.fixture
def hub(gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with fake_hub(repos(gguf)) as served:
        point_library_at(monkeypatch, served.url, tmp_path / "hf")
        yield served


def test_the_default_is_q4_k_m_fetched_once_into_the_library_cache_with_hf_token(
    hub: FakeHub, gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    path = model_file(SOURCE)
    assert path.name == "tiny-Q4_K_M.gguf" and path.is_relative_to(tmp_path / "hf" / "hub")
    assert path.read_bytes() == gguf.read_bytes()
    assert model_file(SOURCE) == path  # the second time from the cache: the Hub is asked, nothing downloaded
    assert hub.downloads() == [f"/{REPO}/resolve/main/tiny-Q4_K_M.gguf"]
    assert {auth for _, url, auth in hub.requests if REPO in url} == {"Bearer hf_secret"}


def test_a_tag_matches_case_insensitively_and_an_exact_file_name_is_taken_as_is(hub: FakeHub, gguf: Path) -> None:
    assert model_file(f"{SOURCE}:q8_0").read_bytes() == gguf.read_bytes()[:1000]
    assert model_file(f"{SOURCE}:tiny-Q4_K_M.gguf").name == "tiny-Q4_K_M.gguf"


def test_a_split_gguf_comes_whole_and_its_first_part_is_the_path(hub: FakeHub) -> None:
    path = model_file(f"{SOURCE}:f16")
    assert path.name == "tiny-F16-00001-of-00002.gguf"
    assert path.read_bytes() + (path.parent / "tiny-F16-00002-of-00002.gguf").read_bytes() == b"first partsecond part"


def test_what_the_hub_does_not_have_is_named_with_what_it_has(hub: FakeHub) -> None:
    with pytest.raises(NotOnHub) as unknown_tag:
        model_file(f"{SOURCE}:Q5_K_M")
    listed = "tiny-F16-00001-of-00002.gguf, tiny-Q4_K_M.gguf, tiny-Q8_0.gguf"
    assert (
        str(unknown_tag.value)
        == f"{SOURCE}:Q5_K_M: the repository has no GGUF file matching 'Q5_K_M'; its GGUF files: {listed}"
    )
    with pytest.raises(NotOnHub, match=r"has no GGUF model file 'tiny-Q5_0\.gguf'"):
        model_file(f"{SOURCE}:tiny-Q5_0.gguf")
    with pytest.raises(NotOnHub, match="the Hub has no model repository 'test-org/missing'"):
        model_file("hf:test-org/missing")
    assert hub.downloads() == []


def test_the_cache_serves_once_the_hub_is_gone(gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_hub(repos(gguf)) as served:
        point_library_at(monkeypatch, served.url, tmp_path / "hf")
        pulled = model_file(SOURCE)
    assert model_file(SOURCE) == pulled  # connection refused: the cached Q4_K_M
    with pytest.raises(HubUnavailable, match=r"ConnectError.*`tokenrelay pull hf:test-org/tiny-GGUF:Q8_0`"):
        model_file(f"{SOURCE}:Q8_0")  # never pulled
    point_library_at(monkeypatch, served.url, tmp_path / "hf", offline=True)
    assert model_file(SOURCE) == pulled


def test_offline_mode_with_nothing_cached_says_to_pull_first(gguf: Path, tmp_path: Path, monkeypatch) -> None:
    with fake_hub(repos(gguf)) as served:
        point_library_at(monkeypatch, served.url, tmp_path / "hf", offline=True)
        with pytest.raises(HubUnavailable) as offline:
            model_file(SOURCE)
    assert str(offline.value) == (
        f"{SOURCE}: the Hugging Face Hub cannot be reached (HF_HUB_OFFLINE is set) and its cache holds no matching "
        f"GGUF; run `tokenrelay pull {SOURCE}` where the Hub is reachable"
    )
    assert [request for request in served.requests if REPO in request[1]] == []


def test_the_chat_template_comes_from_the_repos_tokenizer_config(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fake_hub(repos(gguf)) as served:
        point_library_at(monkeypatch, served.url, tmp_path / "hf")
        assert chat_template_from_repo(SOURCE) == "{{ messages }}"  # the list's "default" entry
        assert chat_template_from_repo("hf:test-org/plain") == "{{ bos_token }}"
        assert chat_template_from_repo("hf:test-org/bare") is None
    assert chat_template_from_repo("hf:test-org/plain") == "{{ bos_token }}"  # the Hub is gone: from the cache
    point_library_at(monkeypatch, served.url, tmp_path / "hf", offline=True)
    assert chat_template_from_repo("hf:test-org/never-fetched") is None


@pytest.mark.parametrize(
    ("source", "names", "chosen"),
    [
        ("hf:o/r", ["b-Q8_0.gguf", "c-Q4_0.gguf", "a-F16.gguf"], ["c-Q4_0.gguf"]),
        ("hf:o/r", ["b.gguf", "a.gguf", "mmproj-a.gguf", "config.json"], ["a.gguf"]),
        ("hf:o/r", ["m-IQ4_K_M.gguf", "m-Q4_K.gguf"], ["m-IQ4_K_M.gguf"]),  # neither is Q4_K_M
        ("hf:o/r:Q4_K", ["m-Q4_K_M.gguf", "m-Q4_K.gguf"], ["m-Q4_K.gguf"]),
        (
            "hf:o/r",
            ["x-00001-of-00002.gguf", "x-00002-of-00002.gguf"],
            ["x-00001-of-00002.gguf", "x-00002-of-00002.gguf"],
        ),
        ("hf:o/r", ["a-00001-of-00003.gguf", "a-00002-of-00003.gguf", "b.gguf"], ["b.gguf"]),  # a part is missing
        (
            "hf:o/r:Q8_0",
            ["Q8_0/m-00002-of-00002.gguf", "Q8_0/m-00001-of-00002.gguf", "m-Q4_0.gguf"],
            ["Q8_0/m-00001-of-00002.gguf", "Q8_0/m-00002-of-00002.gguf"],
        ),
    ],
)
def test_file_choice(source: str, names: list[str], chosen: list[str]) -> None:
    assert choose_files(parse_source(source), names) == chosen


def test_a_repo_without_a_gguf_model_is_said_to_be_so() -> None:
    with pytest.raises(NotOnHub, match="hf:o/r: the repository holds no GGUF model file"):
        choose_files(parse_source("hf:o/r"), ["mmproj-x.gguf", "model.safetensors"])


def test_tokenrelay_pull_prints_the_cached_path(gguf: Path, tmp_path: Path) -> None:
    with fake_hub(repos(gguf)) as served:
        env = server_env(hub_env(served.url, tmp_path / "hf"))
        done = subprocess.run(
            [sys.executable, "-m", "tokenrelay", "pull", f"{SOURCE}:Q4_K_M"], env=env, capture_output=True, timeout=120
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    path = Path(done.stdout.decode().strip())
    assert path.is_relative_to(tmp_path / "hf" / "hub") and path.read_bytes() == gguf.read_bytes()


def test_tokenrelay_pull_fails_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = server_env(hub_env("http://127.0.0.1:9", tmp_path / "hf", offline=True))
    done = subprocess.run(
        [sys.executable, "-m", "tokenrelay", "pull", SOURCE], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().splitlines() == [
        f"tokenrelay pull: {SOURCE}: the Hugging Face Hub cannot be reached (HF_HUB_OFFLINE is set) and its cache "
        f"holds no matching GGUF; run `tokenrelay pull {SOURCE}` where the Hub is reachable"
    ]
    assert run_pull(argparse.Namespace(source="hf:just-a-name")) == 1
    assert capsys.readouterr().err.startswith("tokenrelay pull: model source 'hf:just-a-name': 'just-a-name' is not")
