"""hcomm.models: the reference Llama, its configs, and the Hugging Face wrapper (CPU, tiny shapes)."""
import dataclasses
import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from hcomm.models import (
    CONFIGS, Llama, LlamaConfig, build_hf_llama, build_model, get_config, layer_modules, param_count,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
requires_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")

# Small enough that every test runs in milliseconds, with GQA and an untied head.
MICRO = LlamaConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)


def tokens(batch, seq_len, vocab=MICRO.vocab_size, seed=0):
    return torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


def built_numel(model):
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


# -- parameter counts ------------------------------------------------------------------------

@pytest.mark.parametrize("config", [
    CONFIGS["tiny"], CONFIGS["small"], MICRO, dataclasses.replace(MICRO, tie_embeddings=True, ffn_hidden=50),
], ids=["tiny", "small", "micro-gqa", "micro-tied"])
def test_param_count_equals_built_model(config):
    assert param_count(config) == built_numel(build_model(config))


def test_named_config_param_counts():
    assert param_count("tiny") == 1_066_112
    assert param_count("small") == 16_913_280
    assert param_count("llama-7b") == 6_738_415_616
    assert param_count("llama-7b") == pytest.approx(6.74e9, rel=0.01)
    assert param_count("llama-70b") == pytest.approx(68.9e9, rel=0.01)
    assert param_count("tiny", vocab_size=2048) - param_count("tiny") == 2 * 1024 * 128


def test_meta_build_of_llama_70b_allocates_nothing():
    model = build_model("llama-70b", device="meta", dtype=torch.bfloat16)
    tensors = list(model.parameters()) + list(model.buffers())
    assert all(t.is_meta for t in tensors)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert built_numel(model) == param_count("llama-70b")
    assert built_numel(model) == pytest.approx(68.9e9, rel=0.01)
    assert model.blocks[0].attn.rope_cos.shape == (4096, 128)


# -- forward and loss --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_shape_and_dtype(dtype):
    model = build_model(MICRO, dtype=dtype)
    logits = model(tokens(3, 10))
    assert logits.shape == (3, 10, MICRO.vocab_size)
    assert logits.dtype == dtype
    assert torch.isfinite(logits).all()


def test_forward_is_causal_exactly():
    model = build_model(MICRO)
    original = tokens(2, 12)
    changed = original.clone()
    position = 7
    changed[:, position] = (changed[:, position] + 1) % MICRO.vocab_size
    with torch.no_grad():
        before, after = model(original), model(changed)
    assert torch.equal(before[:, :position], after[:, :position])
    assert not torch.equal(before[:, position], after[:, position])


def test_sequence_longer_than_max_seq_len_is_rejected():
    with pytest.raises(ValueError, match="max_seq_len=16"):
        build_model(MICRO)(tokens(1, 17))


def test_loss_shifts_targets_and_mean_is_sum_over_token_count():
    model = build_model(MICRO)
    batch = tokens(3, 9)  # 3 sequences of 8 inputs + 8 targets
    with torch.no_grad():
        mean, total = model.loss(batch, "mean"), model.loss(batch, "sum")
        logits = model(batch[:, :-1])
    expected = F.cross_entropy(logits.reshape(-1, MICRO.vocab_size), batch[:, 1:].reshape(-1))
    assert mean.item() == pytest.approx(expected.item(), rel=1e-6)
    assert mean.item() == pytest.approx(total.item() / (3 * 8), rel=1e-6)


def test_empty_batch_sum_loss_gives_zero_gradients():
    model = build_model(MICRO)
    loss = model.loss(torch.zeros(0, 9, dtype=torch.long), reduction="sum")
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.equal(param.grad, torch.zeros_like(param)), name


def test_loss_argument_errors():
    model = build_model(MICRO)
    with pytest.raises(ValueError, match="use reduction='sum'"):
        model.loss(torch.zeros(0, 9, dtype=torch.long), reduction="mean")
    with pytest.raises(ValueError, match="reduction"):
        model.loss(tokens(1, 9), reduction="none")
    with pytest.raises(ValueError, match=r"\[B, S\+1\]"):
        model.loss(tokens(1, 1))


def test_gradient_steps_reduce_loss_on_a_repeated_batch():
    model = build_model(MICRO)
    batch = tokens(4, 12)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        loss = model.loss(batch)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0] - 0.5


# -- initialisation and determinism ------------------------------------------------------------

def test_same_seed_gives_bitwise_identical_params_and_leaves_caller_rng_alone():
    torch.manual_seed(1234)
    rng_before = torch.get_rng_state()
    first, second = build_model("tiny", seed=7), build_model("tiny", seed=7)
    assert torch.equal(torch.get_rng_state(), rng_before)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name
    other = build_model("tiny", seed=8)
    assert not torch.equal(first.embed.weight, other.embed.weight)


def test_meta_then_to_empty_then_init_weights_equals_build_model():
    # The path a sharded trainer takes for models too large to build whole.
    config = dataclasses.replace(MICRO, tie_embeddings=True)
    with torch.device("meta"):
        model = Llama(config)
    model.to_empty(device="cpu")
    torch.manual_seed(3)
    model.init_weights()
    reference = build_model(config, seed=3)
    assert model.head.weight is model.embed.weight
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name
    for block, reference_block in zip(model.blocks, reference.blocks):
        assert torch.equal(block.attn.rope_cos, reference_block.attn.rope_cos)
        assert torch.equal(block.attn.rope_sin, reference_block.attn.rope_sin)


def test_init_statistics():
    config = CONFIGS["tiny"]
    model = build_model(config)
    out_std = 0.02 / math.sqrt(2 * config.n_layers)
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.head.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for block in model.blocks:
        assert block.attn.wq.weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert block.attn.wo.weight.std().item() == pytest.approx(out_std, rel=0.05)
        assert block.ffn.w2.weight.std().item() == pytest.approx(out_std, rel=0.05)
        assert torch.equal(block.attn_norm.weight, torch.ones(config.dim))
        assert torch.equal(block.ffn_norm.weight, torch.ones(config.dim))
    assert torch.equal(model.norm.weight, torch.ones(config.dim))


# -- structure: blocks, layer_modules, tying ---------------------------------------------------

def test_every_block_runs_standalone_and_layer_modules_compose_to_forward():
    model = build_model(MICRO)
    pieces = layer_modules(model)
    assert pieces[0] is model.embed and pieces[-2] is model.norm and pieces[-1] is model.head
    assert pieces[1:-2] == list(model.blocks)
    hidden = torch.randn(2, 11, MICRO.dim)
    for block in model.blocks:
        assert block(hidden).shape == hidden.shape
    batch = tokens(2, 11)
    x = batch
    with torch.no_grad():
        for piece in pieces:
            x = piece(x)
        assert torch.equal(x, model(batch))


def test_tied_embeddings_share_one_tensor_through_build_and_training():
    config = dataclasses.replace(MICRO, tie_embeddings=True)
    model = build_model(config, dtype=torch.bfloat16)
    assert model.head.weight is model.embed.weight
    assert param_count(config) == param_count(MICRO) - MICRO.vocab_size * MICRO.dim
    model = build_model(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.loss(tokens(2, 9)).backward()
    optimizer.step()
    assert model.head.weight is model.embed.weight


def test_layer_modules_rejects_unknown_models():
    with pytest.raises(TypeError, match="layer_modules"):
        layer_modules(torch.nn.Linear(2, 2))


# -- configs: validation, named, YAML ----------------------------------------------------------

@pytest.mark.parametrize("change, field", [
    (dict(dim=30), "dim=30"),
    (dict(n_kv_heads=3), "n_kv_heads=3"),
    (dict(n_layers=0), "n_layers"),
    (dict(vocab_size=-5), "vocab_size"),
    (dict(n_heads=True), "n_heads"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(tie_embeddings="yes"), "tie_embeddings"),
    (dict(dim=36, n_heads=12, n_kv_heads=None), "head dim"),
])
def test_validate_names_the_bad_field(change, field):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(MICRO, **change).validate()


def test_config_helpers():
    config = get_config("tiny")
    config.dim = 64  # a copy: the registry must not change
    assert CONFIGS["tiny"].dim == 128
    assert CONFIGS["tiny"].with_vocab(50).vocab_size == 50 and CONFIGS["tiny"].vocab_size == 1024
    assert LlamaConfig(**CONFIGS["llama-70b"].to_dict()) == CONFIGS["llama-70b"]
    assert CONFIGS["tiny"].hidden_dim == 352  # int(8 * 128 / 3) = 341, rounded up to a multiple of 32
    for config in CONFIGS.values():
        config.validate()
    with pytest.raises(ValueError, match="'tiny'"):
        get_config("tinyy")


def test_yaml_full_config_and_base_override(tmp_path):
    full = tmp_path / "full.yaml"
    full.write_text("vocab_size: 500\ndim: 64\nn_layers: 3\nn_heads: 4\nnorm_eps: 1e-6\nrope_theta: 500000\n")
    config = get_config(str(full))
    assert (config.vocab_size, config.dim, config.n_layers, config.n_heads) == (500, 64, 3, 4)
    assert config.norm_eps == 1e-6  # PyYAML reads "1e-6" as a string; it is coerced
    assert config.rope_theta == 500000.0

    override = tmp_path / "override.yaml"
    override.write_text("base: small\nn_layers: 2\ntie_embeddings: true\n")
    assert get_config(str(override)) == dataclasses.replace(CONFIGS["small"], n_layers=2, tie_embeddings=True)


@pytest.mark.parametrize("text, message", [
    ("base: tiny\nhidden: 3\n", "unknown key 'hidden'"),
    ("base: tiny\ndim: big\n", "LlamaConfig.dim"),
    ("base: tiny\nnorm_eps: tiny\n", "LlamaConfig.norm_eps"),
    ("base: tiny\nn_kv_heads: 3\n", "n_kv_heads=3"),
    ("base: huge\n", "base 'huge'"),
    ("dim: 64\n", "missing field"),
    ("- dim\n", "expected a mapping"),
])
def test_yaml_errors_name_the_file_and_field(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        get_config(str(path))
    assert str(path) in str(error.value)


# -- Hugging Face wrapper ----------------------------------------------------------------------

def test_importing_models_does_not_import_transformers():
    probe = "import sys, hcomm.models; print('transformers' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def copy_into_hf(ours, wrapper):
    inner = wrapper.hf.model
    pairs = [(inner.embed_tokens, ours.embed), (inner.norm, ours.norm), (wrapper.hf.lm_head, ours.head)]
    for layer, block in zip(inner.layers, ours.blocks):
        attention, mlp = layer.self_attn, layer.mlp
        pairs += [
            (attention.q_proj, block.attn.wq), (attention.k_proj, block.attn.wk),
            (attention.v_proj, block.attn.wv), (attention.o_proj, block.attn.wo),
            (mlp.gate_proj, block.ffn.w1), (mlp.up_proj, block.ffn.w3), (mlp.down_proj, block.ffn.w2),
            (layer.input_layernorm, block.attn_norm), (layer.post_attention_layernorm, block.ffn_norm),
        ]
    with torch.no_grad():
        for theirs, mine in pairs:
            theirs.weight.copy_(mine.weight)


@requires_transformers
def test_hf_wrapper_matches_our_llama_with_the_same_weights():
    config = dataclasses.replace(MICRO, rope_theta=500000.0)
    ours, theirs = build_model(config), build_hf_llama(config)
    copy_into_hf(ours, theirs)
    batch = tokens(2, 13)
    with torch.no_grad():
        torch.testing.assert_close(theirs(batch), ours(batch), rtol=0, atol=1e-5)
        torch.testing.assert_close(theirs.loss(batch, "sum"), ours.loss(batch, "sum"), rtol=1e-6, atol=0)


@requires_transformers
def test_hf_wrapper_contract_and_training_step():
    torch.manual_seed(0)
    rng_before = torch.get_rng_state()
    model = build_hf_llama(MICRO, vocab_size=101, seed=1)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert built_numel(model) == param_count(MICRO, vocab_size=101)
    assert len(layer_modules(model)) == MICRO.n_layers + 3
    assert layer_modules(model)[0] is model.hf.model.embed_tokens
    batch = tokens(3, 12, vocab=101)
    assert model(batch[:, :-1]).shape == (3, 11, 101)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        loss = model.loss(batch)
        assert torch.isfinite(loss)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < losses[0] - 0.5


@requires_transformers
def test_hf_wrapper_same_seed_gives_identical_params():
    first, second = build_hf_llama(MICRO, seed=5), build_hf_llama(MICRO, seed=5)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name
