"""What the rejection kernels do with inputs the host cannot check without a sync: more drafts
than max_spec_len in cu_num_draft_tokens, and draft probs that are not probabilities. Neither
may return tokens that look valid: the request's output ends (-1) where the bad input is read,
and the torch reference (the CPU path) follows the kernels where it does not raise.

On CPU the Triton kernels run under the interpreter; on a CUDA machine on CUDA alone.
"""

import os

import pytest
import torch

from specops.spec_decode import rejection_sample

TRITON_DEVICES = (["cpu"] if os.environ.get("TRITON_INTERPRET") == "1" else []) + \
    (["cuda"] if torch.cuda.is_available() else [])
VOCAB = 300


@pytest.fixture(params=TRITON_DEVICES)
def device(request) -> str:
    return request.param


def peaked_logits(draft_rows: int, tokens, device) -> torch.Tensor:
    """[draft_rows, VOCAB] logits whose row i puts almost all its mass on tokens[i] (p ~ 1)."""
    logits = torch.full((draft_rows, VOCAB), -30.0, device=device)
    logits[torch.arange(draft_rows, device=device), torch.as_tensor(tokens, device=device)] = 30.0
    return logits


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("draft_probs", [False, True])
def test_more_drafts_than_max_spec_len_empty_the_request(device, greedy, draft_probs):
    # request 1 has 3 drafts with max_spec_len 2: the bonus token was drawn after all 3, so it
    # cannot follow the first 2; its output is empty. Every draft is its row's argmax
    # (accepted), so without the guard it would read [7, 7, 101].
    logits = peaked_logits(6, [7] * 6, device)
    kw = dict(is_greedy=greedy, temperature=torch.full((3,), 0.8, device=device))
    if draft_probs:
        kw["draft_probs"] = torch.full((6, VOCAB), 1.0 / VOCAB, device=device)
    args = (logits, torch.full((6,), 7, device=device), torch.tensor([2, 5, 6], device=device), 2,
            torch.tensor([100, 101, 102], device=device))
    out = rejection_sample(*args, backend="triton", **kw)
    assert out.tolist() == [[7, 7, 100], [-1, -1, -1], [7, 102, -1]]
    with pytest.raises(ValueError, match="max_spec_len"):
        rejection_sample(*args, backend="torch", **kw)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_a_draft_prob_that_is_not_a_probability_ends_the_request(device, bad):
    # rows 0-5, one draft each but request 3 (rows 3, 4) and request 5 (greedy, row 6):
    #   req 0: q(x) bad at the draft                          -> invalid row: [-1, -1, -1]
    #   req 1: q bad elsewhere, draft accepted (p(x) ~ 1)      -> unaffected: [7, bonus, -1]
    #   req 2: q bad elsewhere, draft rejected (p(x) ~ 0)      -> its residual is no distribution: [-1, ...]
    #   req 3: row 3 accepted with q bad elsewhere, row 4 rejected with a good q -> [7, recovered, -1]
    #   req 4: draft rejected, good q                          -> a recovered token, 9 (p ~ 1 there)
    #   req 5: greedy, q(x) bad                                -> q unread: [7, bonus, -1]
    tops = [7, 7, 9, 7, 9, 9, 7]
    logits = peaked_logits(7, tops, device)
    drafts = torch.full((7,), 7, device=device)
    q = torch.full((7, VOCAB), 1.0 / VOCAB, device=device)
    q[:, 7] = 0.5
    q[0, 7] = bad
    q[1, 40] = bad
    q[2, 40] = bad
    q[3, 40] = bad
    q[6, 7] = bad
    cu = torch.tensor([1, 2, 3, 5, 6, 7], device=device)
    greedy = torch.tensor([False, False, False, False, False, True], device=device)
    args = (logits, drafts, cu, 2, torch.arange(100, 106, device=device))
    kw = dict(draft_probs=q, is_greedy=greedy, temperature=torch.full((6,), 0.8, device=device))
    out = rejection_sample(*args, backend="triton", **kw)
    assert out.tolist() == [[-1, -1, -1], [7, 101, -1], [-1, -1, -1], [7, 9, -1], [9, -1, -1], [7, 105, -1]]
    ref = rejection_sample(*args, backend="torch", **kw)
    assert torch.equal(out.cpu(), ref.cpu()), f"\n{out}\n{ref}"
