"""helpers.training.seed_everything: the same seed gives the same random numbers everywhere."""

import random

import numpy as np
import pytest
import torch

from helpers.training import seed_everything


def draw():
    return random.random(), np.random.rand(), torch.rand(3).tolist()


def test_same_seed_same_numbers_other_seed_other_numbers():
    assert seed_everything(42) == 42
    first = draw()
    seed_everything(42)
    assert draw() == first
    seed_everything(43)
    assert draw() != first


def test_same_seed_same_model_init():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    seed_everything(7)
    a = LlamaForCausalLM(config).state_dict()
    seed_everything(7)
    b = LlamaForCausalLM(config).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad", [-1, 2**32, 4.2, "42", True])
def test_bad_seed_says_what_works(bad):
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*32\).*seed_everything\(42\)"):
        seed_everything(bad)
