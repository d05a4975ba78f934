"""`tokenrelay serve --model hf:org/repo`: the GGUF comes from a (fake) Hugging Face Hub through `huggingface_hub`,
lands in the library's cache, and is served under the repo's name."""

from __future__ import annotations

from pathlib import Path

from fake_hub import fake_hub, hub_env
from servers import start_server

from tokenrelay.backends.llamacpp.default_model import smollm2_path

REPO = "test-org/smol-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_model_pulled_from_the_hub_answers_a_chat(tmp_path: Path) -> None:
    smol = smollm2_path(Path())
    files = {FILE: smol, "mmproj-smol-f16.gguf": b"not a model", "README.md": b"# smol"}
    with fake_hub({REPO: files}) as hub:
        engine = ("--slots", "1", "--ctx-size", "512", "--threads", "1")
        env = hub_env(hub.url, tmp_path / "hf")
        server = start_server(tmp_path, "--model", f"hf:{REPO}", *engine, env=env, data_dir=tmp_path / "data")
        try:
            client = server.client()
            assert [model.id for model in client.models.list()] == ["smol-gguf"]
            reply = client.chat.completions.create(
                model="smol-gguf",
                messages=[
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is the capital of France?"},
                ],
                max_tokens=24,
                temperature=0,
            )
        finally:
            server.stop()
    assert "Paris" in reply.choices[0].message.content and reply.choices[0].finish_reason == "stop"
    assert hub.downloads() == [f"/{REPO}/resolve/main/{FILE}"]
    cached = next((tmp_path / "hf" / "hub").glob(f"models--test-org--smol-GGUF/snapshots/*/{FILE}"))
    assert cached.stat().st_size == smol.stat().st_size
