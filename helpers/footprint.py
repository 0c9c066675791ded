"""What a 4-bit model and its LoRA adapters hold in memory, measured tensor by tensor.

Taught in notebook 05 (QLoRA) and used by notebook 08 (capstone):

- `measure_footprint(model)` counts every tensor's storage once, on whatever device the model is:
  the 4-bit weights with their quantization states, the rest of the frozen base, the adapters;
- `Footprint` holds those bytes and counts; print it for a table, or read its fields to `record`
  them. `helpers.qlora.load_qlora` prints one for the model it loads.

Importing this module is cheap: bitsandbytes loads when `measure_footprint` runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers._util import MIB

__all__ = ["Footprint", "measure_footprint"]


@dataclass(frozen=True)
class Footprint:
    """What a 4-bit model with adapters holds in memory, measured tensor by tensor (bytes)."""

    quantized_bytes: int  # 4-bit weights and their quantization states (scales, codebooks)
    other_bytes: int  # the rest of the frozen base: embeddings, norms, output head, buffers
    adapter_bytes: int  # the trainable LoRA matrices
    quantized_params: int  # how many weights were quantized (their original count)
    other_params: int  # frozen parameters kept in full precision (tied ones once)
    trainable_params: int  # the adapters'

    @property
    def total_bytes(self) -> int:
        return self.quantized_bytes + self.other_bytes + self.adapter_bytes

    @property
    def bits_per_quantized_weight(self) -> float:
        """4 bits of NF4 code plus the scales' share (about 4.13 on a large model with double quantization)."""
        return 8 * self.quantized_bytes / max(self.quantized_params, 1)

    @property
    def fp32_bytes(self) -> int:
        """The same base model, without adapters, in fp32: what the 4-bit footprint is compared to."""
        return 4 * (self.quantized_params + self.other_params)

    def __str__(self) -> str:
        total_params = self.quantized_params + self.other_params + self.trainable_params
        return "\n".join(
            [
                f"4-bit weights   : {self.quantized_bytes / MIB:8.2f} MiB  {self.quantized_params:,} weights in NF4, "
                f"{self.bits_per_quantized_weight:.2f} bits each with their scales",
                f"rest of the base: {self.other_bytes / MIB:8.2f} MiB  embeddings, norms, output head (not quantized)",
                f"LoRA adapters   : {self.adapter_bytes / MIB:8.2f} MiB  {self.trainable_params:,} trainable "
                f"parameters ({100 * self.trainable_params / max(total_params, 1):.2f}% of {total_params:,})",
                f"total           : {self.total_bytes / MIB:8.2f} MiB  vs {self.fp32_bytes / MIB:.2f} MiB for the base "
                f"model in fp32 ({self.fp32_bytes / max(self.total_bytes, 1):.1f}x smaller)",
            ]
        )


def measure_footprint(model) -> Footprint:
    """Measure a 4-bit model's memory: the quantized weights (with their quantization states) and the rest.

    Counts every tensor's storage once (tied embeddings, shared codebooks), on whatever device
    the model is, so the figure is exact on CPU and GPU alike. Taught in notebook 05.

    Returns:
        a `Footprint`; print it for a table, or read its fields (bytes) to `record` them.

    Example:
        >>> fp = measure_footprint(model)  # doctest: +SKIP
        >>> record("qlora_total_mib", fp.total_bytes / 2**20)  # doctest: +SKIP
    """
    import bitsandbytes as bnb

    seen: set[tuple[str, int]] = set()

    def nbytes(tensor) -> int:  # each storage once, whatever views point at it
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()

    quantized_bytes = quantized_params = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            quantized_bytes += nbytes(module.weight) + sum(nbytes(t) for t in _state_tensors(state))
            quantized_params += int(state.shape[0]) * int(state.shape[1])  # (out, in) before packing
    adapter_bytes = other_bytes = other_params = trainable_params = 0
    for name, param in model.named_parameters():  # tied parameters come once
        if isinstance(param, bnb.nn.Params4bit):
            continue
        if "lora_" in name:  # by name: a 4-bit model without an adapter may have trainable norms
            trainable_params += param.numel()
            adapter_bytes += nbytes(param)
        else:
            other_params += param.numel()
            other_bytes += nbytes(param)
    other_bytes += sum(nbytes(b) for b in model.buffers())  # rotary tables and the like
    return Footprint(quantized_bytes, other_bytes, adapter_bytes, quantized_params, other_params, trainable_params)


def _state_tensors(state):
    """The tensors of a bitsandbytes QuantState, nested state (double quantization) included."""
    for name in ("absmax", "code", "offset"):
        if getattr(state, name, None) is not None:
            yield getattr(state, name)
    if getattr(state, "state2", None) is not None:
        yield from _state_tensors(state.state2)
