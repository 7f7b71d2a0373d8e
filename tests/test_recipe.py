"""--pack and --recipe fast (issue 22): --pack needs --no-nsp; the fast recipe sets its values and an explicit flag
wins. What packed rows hold is tests/test_packing.py's."""

from __future__ import annotations

import pytest

from bertgpu.cli import COMMANDS, build_config, build_parser, given_fields
from bertgpu.config import DataConfig
from bertgpu.data.pretraining import check_data
from bertgpu.errors import UserError
from bertgpu.training.recipe import apply_fast_recipe


def test_pack_needs_no_nsp():
    with pytest.raises(UserError, match="--pack needs --no-nsp"):
        check_data(DataConfig(data="x", pack=True))


def _parse(*argv: str):
    """The config as the CLI builds it, with the flags given (cli.given_fields), planned by the recipe."""
    argv = ["pretrain", "--model", "tiny", "--out", "o", "--data", "d", *argv]
    parser = build_parser()
    args = parser.parse_args(argv)
    command = next(a for a in parser._actions if a.dest == "command").choices["pretrain"]
    # as pretrain.run plans it: the recipe's values applied to what the CLI built
    return apply_fast_recipe(build_config(COMMANDS["pretrain"][0], args, given_fields(command, argv[1:], ())))


def test_fast_recipe_sets_its_values_and_explicit_flags_win():
    bert = _parse("--no-nsp")
    assert (bert.data.pack, bert.data.masked_lm_prob, bert.data.max_predictions, bert.dropout) == (
        False,
        0.15,
        20,
        None,
    )
    fast = _parse("--no-nsp", "--recipe", "fast")
    assert (fast.data.pack, fast.data.masked_lm_prob, fast.data.max_predictions, fast.dropout) == (True, 0.3, 40, 0.0)
    assert _parse("--no-nsp", "--recipe", "fast", "--max-seq-length", "512").data.max_predictions == 160
    mine = _parse("--no-nsp", "--recipe", "fast", "--masked-lm-prob", "0.2", "--dropout", "0.1")
    assert (mine.data.masked_lm_prob, mine.data.max_predictions, mine.dropout, mine.data.pack) == (0.2, 20, 0.1, True)
    # BERT's own values typed out are choices too: the recipe leaves them as given
    typed = _parse("--no-nsp", "--recipe", "fast", "--masked-lm-prob", "0.15", "--max-predictions=20")
    assert (typed.data.masked_lm_prob, typed.data.max_predictions, typed.data.pack) == (0.15, 20, True)
    with_nsp = _parse("--recipe", "fast")  # NSP pairs cannot be packed; the rest applies
    assert (with_nsp.data.pack, with_nsp.data.masked_lm_prob) == (False, 0.3)


def test_fast_recipe_starts_the_mlm_bias_at_the_token_frequencies():
    """--recipe fast sets --mlm-bias-init unigram (BENCHMARKS.md: The masked-LM bias at the token frequencies);
    --recipe bert keeps BERT's zeros, and a flag given wins, also at BERT's value."""
    assert _parse("--no-nsp").mlm_bias_init == "zeros"
    assert _parse("--no-nsp", "--recipe", "fast").mlm_bias_init == "unigram"
    assert _parse("--no-nsp", "--recipe", "fast", "--mlm-bias-init", "zeros").mlm_bias_init == "zeros"
    assert _parse("--no-nsp", "--mlm-bias-init", "unigram").mlm_bias_init == "unigram"


def test_fast_recipe_keeps_modernberts_mlm_bias_at_zero():
    """The architecture's choice (``fast_mlm_bias_init``): ModernBERT's unigram bias fine-tuned worse (BENCHMARKS.md:
    ModernBERT keeps a zero masked-LM bias); the flag still sets it."""
    modern = ("--no-nsp", "--recipe", "fast", "--arch", "modernbert")
    assert _parse(*modern).mlm_bias_init == "zeros"
    assert _parse(*modern, "--mlm-bias-init", "unigram").mlm_bias_init == "unigram"


@pytest.mark.parametrize("native", [True, False])
def test_fast_recipe_takes_bf16_on_cpus_that_compute_it_natively(monkeypatch, native):
    """--precision auto under --recipe fast: bf16 autocast where the CPU has bf16 instructions (emulated bf16
    is slower than fp32), fp32 elsewhere; --recipe bert and an explicit --precision are left alone."""
    import torch

    from bertgpu.training import precision
    from bertgpu.training.recipe import fast_recipe

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    cpu = torch.device("cpu")
    fast, bert = _parse("--no-nsp", "--recipe", "fast"), _parse("--no-nsp")
    assert (fast_recipe(fast), fast_recipe(bert)) == (True, False)
    assert precision.resolve_precision("auto", cpu, cpu_bf16=fast_recipe(fast)) == ("bf16" if native else "fp32")
    assert precision.resolve_precision("auto", cpu, cpu_bf16=fast_recipe(bert)) == "fp32"
    assert precision.resolve_precision("fp32", cpu, cpu_bf16=True) == "fp32"
