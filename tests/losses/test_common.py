"""The chunked path shared by every loss: its memory bound, its one-backward rule, float32 under autocast."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from mgsr_lightning.losses import ClipNet, dac_kl, forward_kl, span_correlation_loss


class _VocabRows(TorchFunctionMode):
    """Records the leading size of every tensor a softmax/log_softmax/sort is applied to."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("softmax", "log_softmax", "sort"):
            self.rows.append(args[0].shape[0])
        return func(*args, **(kwargs or {}))


LOSSES = {
    "forward_kl": lambda s, t, m, c: forward_kl(s, t, m, chunk_size=c),
    "dac_kl": lambda s, t, m, c: dac_kl(s, t, m, clip_net=ClipNet(k=8, hidden=8), chunk_size=c)[0],
    "span": lambda s, t, m, c: span_correlation_loss(
        s, t, m, spans=torch.zeros(m.shape, dtype=torch.long), chunk_size=c
    ),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_vocabulary_sized_work_never_exceeds_one_chunk(name, make_case):
    # [rows, V] blocks are the O(chunk·V) memory: with chunk_size=3 no softmax or sort sees more
    # than 3 rows, in the forward or the backward, although there are 4·9 positions
    student, teacher, mask = make_case(B=4, T=9, V=17)
    student.requires_grad_(True)
    with _VocabRows() as log:
        LOSSES[name](student, teacher, mask, 3).backward()
    assert log.rows and max(log.rows) <= 3
    with _VocabRows() as log:
        LOSSES[name](student, teacher, mask, None)
    assert max(log.rows) > 3


def test_chunked_graph_takes_one_backward(make_case):
    # the gradient buffers are scaled in place; autograd refuses a second pass instead of returning a wrong gradient
    student, teacher, mask = make_case()
    student.requires_grad_(True)
    loss = forward_kl(student, teacher, mask, chunk_size=2)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_autocast_does_not_lower_the_precision(chunk_size, make_case):
    student, teacher, mask = make_case()
    clip_net = ClipNet(k=8, hidden=16)
    torch.nn.init.normal_(clip_net.mlp[-1].weight, std=0.5)
    expected, _ = dac_kl(student, teacher, mask, clip_net=clip_net, chunk_size=chunk_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value, _ = dac_kl(student, teacher, mask, clip_net=clip_net, chunk_size=chunk_size)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, expected)
