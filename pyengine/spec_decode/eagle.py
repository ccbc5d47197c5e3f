"""An EAGLE-style proposer: a small head on the target's hidden states drafts K tokens.

It is the smallest real consumer of ``TargetHiddenStates`` (``needs_hidden_states = True``),
kept to show and test the plumbing; a trained EAGLE/MTP head would add a decoder layer with
its own KV cache and read every committed row (``TargetHiddenStates.rows``), and would need
the engine to hand it the steps where no request decodes too (it calls ``propose`` only
when some request does).

For a request whose committed tokens are t[0..L), the target's feature f = h[L-2] (its
final-normed hidden state at the last token whose KV is computed, the one that predicted
t[L-1]) and the token t[L-1] give draft j (j = 1..K) by

    f <- norm(fc([f, embed(t)]))        # [hidden]; norm = the target's final RMSNorm
    t <- argmax(lm_head(f))             # the target's LM head

all on the device, for every request at once; the one host sync is the copy of the
[num_reqs, K] drafts at the end. Drafts are greedy (no draft probabilities: verification
uses q = one-hot, which keeps sampled requests exact too).

The proposer keeps each request's latest feature, so a request that was not scheduled in the
last step (the token budget ran out) still gets drafts; the engine's ``free`` drops it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .proposer import DraftBatch, DraftRequest, ProposeContext, Proposer, check_num_spec_tokens


class EagleHead(nn.Module):
    """fc: [hidden, 2 * hidden] weight and optional [hidden] bias, applied to [feature, embedding].

    Parameters
    ----------
    hidden_size : int
    dtype, device
        Of the parameters (the target's).
    seed : int or None
        Random N(0, 1 / (2 * hidden)) weight from this seed; None leaves the weight for
        ``load`` to fill.
    bias : bool
    """

    def __init__(self, hidden_size: int, dtype=torch.float32, device="cpu", seed: int | None = 0,
                 bias: bool = False):
        super().__init__()
        w = torch.zeros(hidden_size, 2 * hidden_size, dtype=torch.float32)
        if seed is not None:
            w.normal_(0.0, (2 * hidden_size) ** -0.5, generator=torch.Generator().manual_seed(seed))
        self.weight = nn.Parameter(w.to(device=device, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype, device=device), requires_grad=False) \
            if bias else None

    def forward(
        self,
        feature: torch.Tensor,  # [R, hidden]
        embedding: torch.Tensor,  # [R, hidden]
    ) -> torch.Tensor:  # [R, hidden]
        return F.linear(torch.cat((feature, embedding), dim=-1), self.weight, self.bias)

    @classmethod
    def load(cls, path: str, hidden_size: int, dtype=torch.float32, device="cpu") -> "EagleHead":
        """A head from a safetensors file with ``fc.weight`` [hidden, 2 * hidden] (and optionally ``fc.bias``)."""
        from ..model.safetensors_reader import read_safetensors_file

        tensors = read_safetensors_file(path)
        names = set(tensors)
        if "fc.weight" not in names or names - {"fc.weight", "fc.bias"}:
            raise ValueError(f"{path}: an EAGLE head file holds fc.weight (and fc.bias), got {sorted(names)}")
        if tuple(tensors["fc.weight"].shape) != (hidden_size, 2 * hidden_size):
            raise ValueError(f"{path}: fc.weight has shape {tuple(tensors['fc.weight'].shape)}, expected "
                             f"{(hidden_size, 2 * hidden_size)} for the target's hidden size {hidden_size}")
        head = cls(hidden_size, dtype, device, seed=None, bias="fc.bias" in tensors)
        head.weight.copy_(tensors["fc.weight"])
        if head.bias is not None:
            head.bias.copy_(tensors["fc.bias"])
        return head


class EagleProposer(Proposer):
    """Drafts from an ``EagleHead`` on the target's hidden states, through the target's embedding and LM head.

    Parameters
    ----------
    target : LlamaForCausalLM
        The target model (``embed_tokens``, ``norm``, ``compute_logits``).
    head : EagleHead or None
        None: a random head from ``seed`` (drafts then are rarely right; for tests and timing).
    seed : int

    Attributes
    ----------
    features : dict[str, torch.Tensor]
        Request id -> [hidden] its latest target feature (tests read it).
    """

    method = "eagle"
    needs_hidden_states = True

    def __init__(self, target, head: EagleHead | None = None, seed: int = 0):
        hidden = target.config.hidden_size
        self.target = target
        self.device = target.embed_tokens.weight.device
        self.head = head if head is not None else EagleHead(hidden, target.dtype, self.device, seed)
        if self.head.weight.shape != (hidden, 2 * hidden):
            raise ValueError(f"head weight has shape {tuple(self.head.weight.shape)}, expected {(hidden, 2 * hidden)}")
        self.features: dict[str, torch.Tensor] = {}

    @classmethod
    def from_path(cls, target, path: str) -> "EagleProposer":
        """A proposer whose head is loaded with ``EagleHead.load``."""
        hidden = target.config.hidden_size
        return cls(target, EagleHead.load(path, hidden, target.dtype, target.embed_tokens.weight.device))

    def free(self, request_id: str) -> None:
        self.features.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, requests: Sequence[DraftRequest], num_spec_tokens, context: ProposeContext | None = None
                ) -> DraftBatch:
        k_req = check_num_spec_tokens(num_spec_tokens, len(requests))
        ids = [r.request_id for r in requests]
        drafts: list[list[int]] = [[] for _ in requests]
        hidden = context.hidden if context is not None else None
        if hidden is None and requests:
            raise ValueError("the EAGLE proposer needs the target's hidden states in ProposeContext.hidden "
                             "(the engine passes the runner's last_hidden when the proposer needs_hidden_states)")
        fresh = [rid for rid in ids if rid in hidden]
        if fresh:
            for rid, f in zip(fresh, hidden.last(fresh)):  # views of one [R, hidden] gather
                self.features[rid] = f
        active = [i for i in range(len(requests)) if k_req[i] > 0 and ids[i] in self.features]
        if not active:
            return DraftBatch(ids, drafts)
        num_steps = int(k_req[active].max())
        feature = torch.stack([self.features[ids[i]] for i in active])  # [R, hidden]
        last = np.array([requests[i].all_token_ids[-1] for i in active], dtype=np.int64)
        tok = torch.from_numpy(last).to(self.device, non_blocking=True)  # [R]
        out = self._draft_loop(feature, tok, num_steps).cpu().numpy()  # the one device -> host copy
        for row, i in enumerate(active):
            drafts[i] = out[row, :int(k_req[i])].tolist()
        return DraftBatch(ids, drafts)

    def _draft_loop(
        self,
        feature: torch.Tensor,  # [R, hidden] target features h[L-2]
        tok: torch.Tensor,  # [R] int64 tokens t[L-1]
        num_steps: int,
    ) -> torch.Tensor:  # [R, num_steps] int64 drafts
        """K head steps and argmaxes on the device: no host sync inside."""
        t = self.target
        out = torch.empty(tok.shape[0], num_steps, dtype=torch.int64, device=self.device)
        for j in range(num_steps):
            feature = t.norm(self.head(feature, t.embed_tokens(tok)))
            tok = t.compute_logits(feature).argmax(dim=-1)
            out[:, j] = tok
        return out
