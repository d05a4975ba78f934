"""A long slot's sliding-window layers keep only their window, laid out the same way whatever came before.

Models such as Gemma 3 attend over the last few hundred tokens in most layers. Keeping every cell of those layers
(llama.cpp's `swa_full`) costs memory and time that grow with the context: each step walks all of them. Kept as a
window, the layers reuse cells that fell out of it, so where a token's cells land depends on the history, and
attention sums over cells in cell order: a cached prefix would give other answers than a fresh evaluation, and a
cut-back cache has lost the cells that fell out of the window. So at the end of every full prompt piece the
sequence's cells are saved and loaded back (`settle`), which lays them out from the first cell in one order, and
the window's cells are kept as a checkpoint. A later job that shares the prompt up to a checkpoint starts from it
(`resume`), with the cells where a fresh evaluation would have them at that point.
"""

from __future__ import annotations

from tokenrelay.backends.llamacpp.context import LlamaContext
from tokenrelay.backends.llamacpp.slots import Slot

KEEP = 2  # checkpoints per slot: the last piece starts of the prompt, where a next turn resumes


def settle(context: LlamaContext, slot: Slot) -> None:
    """After a piece ending at a piece boundary: the cells laid out canonically, and the window kept there."""
    context.load(slot.seq_id, context.save(slot.seq_id))
    slot.checkpoints[len(slot.cache)] = context.save(slot.seq_id, window_only=True)
    for position in sorted(slot.checkpoints)[:-KEEP]:
        del slot.checkpoints[position]


def resume(context: LlamaContext, slot: Slot, keep: int) -> int:
    """Cut the slot's cells back to its last checkpoint at or before `keep`, laid out as after `settle` there;
    returns that position (0, the cells cleared, when there is none)."""
    position = max((p for p in slot.checkpoints if p <= keep), default=0)
    for later in [p for p in slot.checkpoints if p > position]:
        del slot.checkpoints[later]
    if position == 0:
        context.reset()  # the slot is the context's only sequence; its first piece then lands where a fresh one does
        return 0
    context.keep_prefix(slot.seq_id, position)
    # The full layers' cells, and whatever is left of the window, laid out from the first cell; the window's
    # cells then replace the latter from the first cell on, as `settle` left them.
    context.load(slot.seq_id, context.save(slot.seq_id))
    context.load_window(slot.seq_id, slot.checkpoints[position])
    return position
