"""Random Llamas small enough to build in milliseconds, for tests that need a model and not the embedded one.

Their sizes are the arguments (the MLP is twice the hidden width, as in the tests that built their own); the
weights come from the seed, so two calls with the same arguments build the same model.
"""

from helpers.seeds import seed_everything


def tiny_llama_config(
    *, vocab: int = 128, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2, **more
):
    """A LlamaConfig with grouped-query attention (`heads` query heads share `kv_heads` key/value heads)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        **more,
    )


def tiny_llama(*, seed: int = 0, **config):
    """A LlamaForCausalLM of `tiny_llama_config(**config)` in fp32 and training mode, its weights drawn after
    seed_everything(seed)."""
    from transformers import LlamaForCausalLM

    seed_everything(seed)
    return LlamaForCausalLM(tiny_llama_config(**config)).train()
