"""farmkit.lm.models: resolving model arguments, the cached embedded model, meta.json, devices, and the
prompt format a folder records."""

from __future__ import annotations

import json

import pytest

from farmkit.core.io import FarmError
from farmkit.lm import models


def test_embedded_resolves_to_a_plain_cached_folder(embedded_path):
    from safetensors import safe_open

    assert models.resolve("embedded") == str(embedded_path)
    config = json.loads((embedded_path / "config.json").read_text())
    assert "quantization_config" not in config  # a plain fp32 model that trainers accept
    assert models.read_meta(embedded_path)["name"] == "SmolLM2-135M-Instruct"
    with safe_open(str(embedded_path / "model.safetensors"), "pt") as weights:
        count = sum(_product(weights.get_slice(name).get_shape()) for name in weights.keys())
    assert 134_000_000 < count < 135_000_000  # 134.5M parameters, output embeddings tied


def _product(shape: list[int]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def test_a_folder_cached_by_an_older_farmkit_is_repaired(tmp_path):
    folder = tmp_path / "cached"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "gguf"}})
    )
    assert models._gguf_marked(folder)
    models._drop_gguf_mark(folder)
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "llama"}


def test_resolve_model_arguments(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_hub_reachable", lambda: True)  # a hub id passes through
    assert models.resolve(tmp_path) == str(tmp_path)
    assert (
        models.resolve("HuggingFaceTB/SmolLM2-135M-Instruct")
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    with pytest.raises(FarmError, match="no such model folder"):
        models.resolve(str(tmp_path / "missing" / "model"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(FarmError, match="not a model folder or a .gguf file"):
        models.resolve(tmp_path / "weights.bin")


def _hub_cache(monkeypatch, folder):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder))


def _no_network(monkeypatch):
    """Any attempt to reach the hub fails the test: the refusals below must not need one."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("resolve() tried the network")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(models, "_hub_reachable", refuse)  # the probe runs in a thread of its own


@pytest.mark.parametrize("typo", ["embeded", "embedd", "Embedded", "embedded "])
def test_a_typo_of_embedded_is_refused_at_once_naming_embedded(typo, monkeypatch, tmp_path):
    """`farm-sample embeded` once spent 53 s on hub retries and then printed transformers' offline
    message: a bare name close to a known alias is refused before any network call, naming it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    _no_network(monkeypatch)
    with pytest.raises(FarmError, match="did you mean 'embedded'") as error:
        models.resolve(typo)
    assert str(error.value).startswith(f"{typo}: ")


def test_offline_a_hub_id_not_in_the_cache_is_refused_at_once(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _hub_cache(monkeypatch, tmp_path / "hub")
    _no_network(monkeypatch)
    with pytest.raises(FarmError, match="HF_HUB_OFFLINE") as error:
        models.resolve("someone/no-such-model")
    assert "not in the hub cache" in str(error.value)


def test_an_unreachable_hub_is_refused_at_once(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    _hub_cache(monkeypatch, tmp_path / "hub")
    monkeypatch.setattr(models, "_hub_reachable", lambda: False)
    with pytest.raises(FarmError, match="cannot reach the hub"):
        models.resolve("someone/no-such-model")
    # a folder typed wrong under an existing one: the neighbour is suggested
    (tmp_path / "runs" / "sft").mkdir(parents=True)
    with pytest.raises(FarmError, match="did you mean 'runs/sft'"):
        models.resolve("runs/sfr")


def test_a_cached_hub_id_resolves_offline(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE with the model in the hub cache: the id passes through (transformers loads it)."""
    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--cached" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--someone--cached" / "refs").mkdir()
    (cache / "models--someone--cached" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _hub_cache(monkeypatch, cache)
    _no_network(monkeypatch)
    assert models.resolve("someone/cached") == "someone/cached"


def test_farm_sample_with_a_typo_fails_fast_naming_embedded(tmp_path):
    """The audit's case end to end, without HF_HUB_OFFLINE: exit 1 without asking the hub (whose
    retries took 53 s without a network), and the message names `embedded`. The hub is reached
    through a proxy that counts the connections it gets: none."""
    import socket
    import threading

    from conftest import run_tool

    listener = socket.create_server(("127.0.0.1", 0))
    connections = []

    def count() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            connections.append(connection)
            connection.close()

    threading.Thread(target=count, daemon=True).start()
    proxy = f"http://127.0.0.1:{listener.getsockname()[1]}"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"instruction": "Say hi."}\n')
    try:
        env = {name: proxy for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")}
        done = run_tool("farm-sample", "embeded", str(prompts), timeout=120, env=env)
    finally:
        listener.close()
    assert connections == []  # the hub was not asked (and so not retried)
    assert done.returncode == 1
    assert "did you mean 'embedded'" in done.stderr.decode(), done.stderr.decode()[-800:]


def test_meta_round_trip_and_input_hashes(tmp_path):
    models.write_meta(
        tmp_path,
        {"kind": "policy", "prompt_template": "alpaca", "sampling_control_token": "<|good|>"},
    )
    assert models.read_meta(tmp_path)["kind"] == "policy"
    assert models.read_meta(tmp_path / "elsewhere") == {}
    fmt = models.PromptFormat.for_model(tmp_path)
    assert (fmt.template, fmt.control) == ("alpaca", "<|good|>")
    assert (
        models.PromptFormat.for_model(tmp_path, "chat").template == "chat"
    )  # an explicit choice wins
    (tmp_path / "data.jsonl").write_text("abc")
    assert (
        models.file_sha256(tmp_path / "data.jsonl")
        == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    (tmp_path / "meta.json").write_text("{broken")
    with pytest.raises(FarmError, match="not valid JSON"):
        models.read_meta(tmp_path)


def test_device_and_precision():
    import torch

    assert models.choose_device("cpu") == "cpu"
    assert models.choose_dtype("cpu") == torch.float32
    assert models.choose_dtype("cuda", "bf16") == torch.bfloat16
    if not torch.cuda.is_available():
        assert models.choose_device() == "cpu"


def test_load_causal_lm_pads_on_the_left(tiny_model_path):
    network, tokenizer = models.load_causal_lm(tiny_model_path, device="cpu")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    assert network.config.pad_token_id == tokenizer.pad_token_id
    assert next(network.parameters()).dtype.is_floating_point


def test_under_a_launcher_each_process_takes_the_gpu_of_its_local_rank(monkeypatch):
    """On a GPU machine (pretended: no GPU is lent to CI) a process started by torchrun or accelerate
    launch loads onto cuda:LOCAL_RANK, not every process onto GPU 0; alone it takes the default GPU;
    an explicit --device wins."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert models.choose_device() == "cuda"
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert models.choose_device() == "cuda:3"
    assert models.choose_device("auto") == "cuda:3"
    assert models.choose_device("cuda:0") == "cuda:0" and models.choose_device("cpu") == "cpu"
