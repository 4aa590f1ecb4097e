"""How many drafts a round verifies: the recipe's concurrency bands, or chosen live.

Every draft length is lossless (the round loop accepts a prefix of the drafts and adds the
target's own token), so a policy only trades acceptance against the verify cost:

  Bands        speculative.draft_len bands: the draft length of the band the number of running
               requests falls in (block_size - 1 without bands). 0 turns speculation off.
  AutoDraftLength   `draft_len: auto`. The acceptance model: the chance that a request r accepts
               draft slot j given it accepted the slots before it is a_rj = sigmoid(b_j + s_r):
               one slot curve b for every request (the pair's profile) and one shift s_r per
               request (how much easier or harder than usual its text is), both learnt online from
               every slot a round observed (logistic regression by stochastic gradient). The
               expected tokens a round of length L commits for request r, E_r(L) = 1 + sum_{k=1..L}
               prod_{j<=k} a_rj; and the round cost measured when the server starts (VerifyCost),
               corrected by what the rounds of each shape (requests, longest drafts) took since
               (a shape not run yet: as its neighbours were corrected).
               It picks the draft lengths that maximise sum_b E_b(L_b) / t: the tokens per second
               of the whole batch: one L for the batch, and on a packed target runner (only each request's
               own tokens are verified) 0 (plain decoding) for the requests whose drafts do not
               pay for their tokens. That sets the drafter's block. Against the best fixed length at
               c = 2, 4, 8, 16 (perf/bench_engine_policy, 2026-11-26): this rule 0.92, 0.95, 1.00,
               1.00; any length per request (`mixed`, Dinkelbach's iteration) 0.89, 0.87, 0.96, 1.03.
               Then `trim`: once the block is drafted, the drafter's own confidence in each slot
               (its distribution's top probability) says which drafts will hold far better than
               past rounds do, so each request verifies the prefix that maximises the same tokens
               per second with acceptance from those confidences (Decoder.step's trim: lossless, the
               drafter's pass already paid). Replayed over 398 requests (perf/replay_draft_policy,
               two request sets, c = 1..16): 1.01-1.04x the best fixed length in hindsight, where
               choosing before drafting alone was 0.99-1.02x.
               DDTree decoders (`choose_tree`): each round is a tree of one of a few node budgets
               (the deployment's ddtree_budget, its half and quarter), a chain round of
               per-request lengths, or plain decoding, whichever promises the most tokens per
               second: a tree's value is the mean tokens its rounds of that budget committed per
               request (over every request, optimistic until observed), its cost every row
               verifying budget + 1 tokens; the chain's is as above. So under load a DDTree
               deployment degrades to chains, then to 0. Tree rounds teach the chain estimates too:
               under greedy decoding a tree holds the drafter's argmax chain, and how much of it
               the target accepted is exactly what a chain round would have accepted
               (StepRecord.chain).
The serving batcher asks the policy once per round for every decoder (sampling group) whose
mode the policy sets (`modes`): `choose` for chain decoders, `choose_tree` for DDTree ones, and
hands it back each such round (`learn`). Bands set DDTree's depth as a chain's length.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch


class DraftPolicy(Protocol):
    modes: tuple[str, ...]  # the decoding modes whose draft length (DDTree: depth) it sets

    def trimmer(self, batch: int) -> Callable[[list[int], list[int], torch.Tensor], Sequence[int]] | None:
        """What the serving loop hands Decoder.step as `trim` (generate.Trim) for a round of
        `batch` requests it chose: once the round is drafted, the drafts each request verifies;
        None: every chosen draft."""

    def choose(self, requests: Sequence[int], concurrency: int) -> int | dict[int, int]:
        """Drafts to verify this round for `requests` (one decoder's batch) when `concurrency`
        requests are running in all: one for all, or one per request ({request: drafts})."""

    def choose_tree(self, requests: Sequence[int], concurrency: int) -> tuple[int | dict[int, int], int | None]:
        """A DDTree decoder's round: (draft lengths as `choose` gives them: the tree's depth, or
        the chain's lengths; tree budget: Decoder.step's tree_budget, 0 = a chain round, None =
        the deployment's budget)."""

    def learn(self, rec, seconds: float | None = None) -> None:
        """What a round (a generate.StepRecord of one of `modes`) teaches: each request's
        acceptance, and, with `seconds`, what a round of its shape cost (whoever chose its lengths)."""

    def forget(self, request: int) -> None:
        """The request left."""


class Bands:
    """The recipe's static bands: [(max_concurrency, draft_len), ...], increasing."""

    modes = ("dflash", "ddtree")

    def __init__(self, bands: Sequence[tuple[int, int]], block_size: int):
        self.bands, self.block_size = list(bands), block_size

    def choose(self, requests, concurrency):
        for limit, n in self.bands:
            if concurrency <= limit:
                return n
        return self.bands[-1][1] if self.bands else self.block_size - 1

    def choose_tree(self, requests, concurrency):
        return self.choose(requests, concurrency), None

    def trimmer(self, batch):
        return None

    def learn(self, rec, seconds=None):
        pass

    def forget(self, request):
        pass


@dataclass
class VerifyCost:
    """Seconds of one round whose requests verify L_b drafts each:
    fixed + per_token * sum_b (L_b + 1) + per_slot * B * (max L + 1) + draft (when any L_b > 0).
    per_token is what each verified token costs (projections, MLP); per_slot what the padded
    [B, max L + 1] part costs (attention). On a runner that is not `packed` every row runs
    max L + 1 tokens, so the two are one term (per_slot = 0) and rows of one round share one L.
    Measured by `measure_cost` when the server starts."""

    fixed: float
    per_token: float
    draft: float
    per_slot: float = 0.0
    packed: bool = False
    # what start-up timed per (requests, longest drafts + 1) when every request drafted alike: the
    # median round, in seconds. A round's time is not linear in its tokens (kernel tiles: on the
    # 2-core CPU the shipped pair verifies 8 tokens in 7.6 ms, 10 in 8.5 ms, 12 in 8.4 ms), so the
    # policy starts from these (AutoDraftLength.correction) where it has them.
    timed: dict[tuple[int, int], float] = field(default_factory=dict)
    # the drafter's pass in those rounds (median, seconds): a round that drafts a block and
    # verifies fewer of its drafts (AutoDraftLength.trim) pays the drafter for the whole block
    timed_draft: dict[tuple[int, int], float] = field(default_factory=dict)

    def round_s(self, batch: int, draft_len: int) -> float:
        """Every one of `batch` requests verifies `draft_len` drafts."""
        return self.lengths_s([draft_len] * batch)

    def lengths_s(self, lengths: Sequence[int]) -> float:
        return self.verify_s(lengths) + (self.draft if max(lengths) > 0 else 0.0)

    def verify_s(self, lengths: Sequence[int]) -> float:
        """The round without its drafter pass: the target verifying these lengths, and the rest."""
        T = max(lengths) + 1
        tokens = sum(L + 1 for L in lengths) if self.packed else len(lengths) * T
        return self.fixed + self.per_token * tokens + self.per_slot * len(lengths) * T

    def draft_s(self, batch: int, T: int) -> float:
        """The drafter's pass for `batch` requests and a block of T (0 for T = 1: nothing is
        drafted): as start-up timed it, else a line in the block's tokens (batch x T) through
        what start-up timed (the shipped pair on 2 cores: 1.1 ms + 0.045 ms a token within 10%,
        16 x 16 tokens included, which start-up does not time), else the fit's `draft`."""
        if T <= 1:
            return 0.0
        if (batch, T) in self.timed_draft:
            return self.timed_draft[(batch, T)]
        if self._draft_line is None:
            return self.draft
        intercept, slope = self._draft_line
        return max(0.0, intercept + slope * batch * T)

    @functools.cached_property
    def _draft_line(self) -> tuple[float, float] | None:
        """(intercept, slope) of the least-squares line through timed_draft in batch x T, once
        (draft_s runs inside every trim); None with fewer than two distinct points."""
        points = [(B * t, s) for (B, t), s in self.timed_draft.items() if t > 1]
        if len({x for x, _ in points}) < 2:
            return None
        mx, my = sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points)
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
        return my - slope * mx, slope

    def timed_verify_scale(self, batch: int, T: int) -> float | None:
        """What start-up timed for a uniform round of `batch` requests and block T, less the
        drafter's share, over verify_s (None: start-up did not time that shape)."""
        seconds = self.timed.get((batch, T))
        if seconds is None:
            return None
        return max(seconds - self.timed_draft.get((batch, T), 0.0), 0.0) / self.verify_s([T - 1] * batch)


@dataclass
class AutoDraftLength:
    block_size: int
    cost: VerifyCost
    # The acceptance model, a_rj = sigmoid(b_j + s_r). Before anything is observed every slot is at
    # `prior`: optimistic, since a slot is observed only when drafted (a pessimistic estimate would
    # never be tested; the bench's shipped pair with estimates per request and slot, 0.6: c = 1 at
    # 0.81x the best fixed length, 0.9: 0.93x).
    # Why one shift per request and not an estimate per request and slot (sessions before 2026-11-26):
    # a request's own estimate of a slot learns only when it reaches that slot, so a request that
    # rarely gets past slot 5 kept the pool's late-slot estimates, which come from the requests that
    # do get there, the easy ones (on the sweep's prompts a request's tokens per round at 7 drafts
    # range 1.6 to 7.4); it overrated long drafts. A shift carries what a request's early slots say
    # to its late ones, and learning the curve with the shifts keeps the easy requests' hits from
    # inflating it. Measured in process (an ad hoc loop, the curve's rate constant), c = 1, 4, 8 over
    # the best of 3, 7, 15 fixed drafts: per-slot estimates 0.89, 0.96, 0.95; the shift 1.01, 0.96, 1.02.
    # Not modelled: acceptance is autocorrelated within a request (stretches of repeated code, then
    # new text: over rounds of 15 drafts at c = 1 the lag-1 correlation of the accepted count, each
    # request's mean removed, is 0.66), so how often a round's slot 1 is accepted depends on how
    # long the rounds draft (0.76 at 1 draft, 0.70 at 3, 0.64 at 15: long drafts cross the easy
    # stretches in few rounds), not on the drafter's block (per position, 0.79 in blocks of 2 and
    # 0.80 of 16; perf/replay_draft_policy's recording of 398 requests). A weight on the last
    # round's accepted count beside the shift gained at c = 1 on one recorded request set and
    # nothing on another, and an offset per block length did worse (c = 1: 0.91 against 1.01).
    prior: float = 0.9
    request_rate: float = 0.25  # the shifts' learning rate (per observed slot)
    # the curve's: slot j's step is max(slot_rate, 1 / (prior_weight + n_j)) after n_j observations of
    # it, so its first observations count as a running mean's would (against `prior` worth
    # prior_weight of them: slots past the usual length are observed only now and then, and ten
    # of them must outweigh an optimistic prior), then it tracks at slot_rate
    slot_rate: float = 0.03
    prior_weight: float = 2.0
    decay: float = 0.8  # a request that drafts nothing: its shift falls back by this factor a round
    # every n-th choice drafts 2L + 1 (0: never, the default), see `choose`. With an estimate per
    # request and slot, probes were how slots past L got observed; with the shift, the curve is
    # optimistic where unobserved and easy requests (high shifts) draft long and observe late
    # slots for every request. Measured in process over the best of 3, 7 fixed drafts at c = 4, 8:
    # probing every 16th round 0.96, 1.01; never 1.00, 1.02; always 3 drafts through the policy
    # (its cost without its choice) 1.00, 1.00.
    probe_every: int = 0
    mixed: bool = False  # packed runners: the best one length, or 0, per request (True: any length, `best_per_request`)
    slot_logits: list[float] = field(default_factory=list)  # b_j, j = 1..block_size - 1
    slot_seen: list[float] = field(default_factory=list)  # n_j
    shifts: dict[int, float] = field(default_factory=dict)  # s_r of every running request
    # the running requests whose prompt the drafter has projected: a round with a drafter pass ran
    # since they joined (`learn`)
    projected: set[int] = field(default_factory=set)
    # measured / modelled round time without the drafter's pass (VerifyCost.verify_s), by
    # (requests, longest verified drafts + 1), from the rounds that ran (`observe_round`): the
    # start-up fit misses shapes it did not time (larger batches) and costs it does not model
    correction: dict[tuple[int, int], float] = field(default_factory=dict)
    # measured / start-up drafter pass (StepRecord.t_draft over VerifyCost.draft_s), by (requests,
    # block drafted). Not the target's: under load, on longer contexts than start-up's prompts, the
    # drafter's pass took longer than start-up timed it (in process at c = 4 on the shipped pair,
    # before the drafter packed its context rows and `learn` skipped rounds after a join: 1.2-1.5x,
    # the longer the block the more) while the target's verify took less (0.9x), so a correction
    # of the whole round would rate long blocks that a trim cuts short too cheap
    draft_correction: dict[tuple[int, int], float] = field(default_factory=dict)
    correction_decay: float = 0.9
    # DDTree decoders: the node budgets a round may use (empty: DDTree keeps the deployment's
    # budget and full depth), and per budget the mean tokens its rounds committed per request
    # (absent: not observed yet, see `tree_tokens_of`) and measured / modelled time by (requests,
    # budget)
    tree_budgets: tuple[int, ...] = ()
    tree_tokens: dict[int, float] = field(default_factory=dict)
    tree_correction: dict[tuple[int, int], float] = field(default_factory=dict)
    tree_decay: float = 0.9
    # `trim`: once a round is drafted, how much of it to verify, from how sure the drafter was of
    # each slot (its distribution's top probability c_j). Acceptance given the drafts before it is
    # then sigmoid(u_j + w * logit(c_j) + confidence_shift * s_r): the drafter's own probability
    # (w = 1, u = 0: taken at its word) corrected per slot and in weight by what rounds accepted
    # (stochastic gradient at confidence_rate), and the request's shift. The drafter sees the
    # very text it drafts; the shift only the rounds before. On the shipped pair the confidence
    # alone brings the log-loss of a slot's acceptance from 0.37 (slot only) to 0.27, and its
    # acceptance tracks it (slots at 0.3-0.5: 0.54 accepted; at 0.8-0.9: 0.94).
    # Rounds of at most trim_batch requests are trimmed (0: none). Measured in process on the
    # shipped pair (2-core CPU, tokens/s of 4-request rounds, five runs): trimming cost 2-4% against
    # the same policy untrimmed at c = 4; it gained 3% at c = 1 and was a wash at c = 2 (-2% and +2%
    # in two runs). At 4 requests the trim's rounds cost more than modelled: the confidence and
    # the trim itself in the drafter's time (+0.3-0.4 ms a round) and a target pass of rows of
    # different lengths (+0.5 ms, 6%), while each cut row saves little of a padded round.
    trim_batch: int = 2
    confidence_slots: list[float] = field(default_factory=list)  # u_j
    confidence_weight: float = 1.0  # w
    confidence_shift: float = 0.5
    confidence_rate: float = 0.01  # u's
    confidence_weight_rate: float = 0.002  # w's (its feature, a logit, runs to +-9)
    _choices: int = 0
    # verify_scale's index of `correction`: the blocks T seen per batch size, sorted, rebuilt when
    # a shape is added (each key's value changes every round, its keys rarely)
    _by_batch: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _by_batch_size: int = field(default=-1, init=False, repr=False, compare=False)
    modes = ("dflash", "ddtree")  # a class attribute (no annotation): not a dataclass field

    def __post_init__(self):
        K = self.block_size - 1
        for B, T in self.cost.timed:  # start from what start-up timed
            self.correction.setdefault((B, T), self.cost.timed_verify_scale(B, T))
        self.slot_logits = self.slot_logits or [math.log(self.prior / (1 - self.prior))] * K
        self.slot_seen = self.slot_seen or [0.0] * K
        self.confidence_slots = self.confidence_slots or [0.0] * K

    @property
    def population(self) -> list[float]:
        """Every slot's acceptance for a request of shift 0 (a new one): sigmoid(b_j)."""
        return [_sigmoid(b) for b in self.slot_logits]

    def acceptance(self, request: int) -> list[float]:
        """a_rj = sigmoid(b_j + s_r) for j = 1..block_size - 1 (a new request: shift 0)."""
        s = self.shifts.get(request, 0.0)
        return [_sigmoid(b + s) for b in self.slot_logits]

    def expected_curve(self, request: int) -> list[float]:
        """E(L) = 1 + sum_{k<=L} prod_{j<=k} a_j for L = 0..block_size - 1: tokens one round
        commits (the bonus counts)."""
        return [1.0 + e for e in itertools.accumulate(self._increments(request), initial=0.0)]

    def expected_tokens(self, request: int, draft_len: int) -> float:
        return self.expected_curve(request)[draft_len]

    def best(self, requests) -> int:
        """The one draft length of highest expected tokens per second for this batch."""
        return self._best([self.expected_curve(r) for r in requests])

    def _best(self, curves: list[list[float]]) -> int:
        """`best` from each request's expected_curve (computed once a round, not once a length)."""
        B = len(curves)
        return max(range(self.block_size), key=lambda L: sum(c[L] for c in curves) / self.round_s([L] * B))

    def best_per_request(self, requests) -> list[int]:
        """Each request's draft length, jointly of highest expected tokens per second (packed
        runners): `_best_prefixes` over the acceptance estimates."""
        if not requests:
            return []
        return self._best_prefixes([self._increments(r) for r in requests], self.round_s)

    def _best_prefixes(self, inc: list[list[float]], seconds) -> list[int]:
        """Per row b a prefix length L_b of highest sum_b E_b(L_b) / seconds(lengths), where
        E_b(L) = 1 + sum_{k<=L} inc[b][k-1] and inc [B][K] is each slot's expected extra token
        (non-increasing along a row; 0 past what a row may verify).

        For each longest length: every row at it (or its own end), then Dinkelbach's iteration:
        the cost is linear in sum_b L_b for that longest, so at the current rate r each row keeps
        the slots whose expected extra token beats r * per_token, what a verified token costs in
        tokens of rate, and r becomes the rate of that choice (a few steps converge). The best.
        Plain Python: B <= a few dozen rows of K <= 31 slots, chosen every round (torch's
        per-op overhead made this 0.5 ms a round at one request)."""
        B = len(inc)
        gain = [list(itertools.accumulate(row, initial=1.0)) for row in inc]  # [B][K+1]: E_b(L)
        cap = [sum(1 for x in row if x > 0) for row in inc]

        def rate(L: list[int]) -> float:
            return sum(g[n] for g, n in zip(gain, L)) / seconds(L)

        best = [0] * B
        best_rate = rate(best)
        for longest in range(1, max(cap, default=0) + 1):
            L = [min(c, longest) for c in cap]
            r = rate(L)
            for _ in range(4 if B > 1 else 0):  # one row: its prefixes are the candidates
                if r > best_rate:
                    best, best_rate = L, r
                threshold = r * self.cost.per_token * self.verify_scale(B, longest + 1)
                L = [_prefix_above(row, longest, threshold) for row in inc]
                r_new = rate(L)
                if abs(r_new - r) < 1e-9 * r_new:
                    break
                r = r_new
            if r > best_rate:
                best, best_rate = L, r
        return best

    def best_or_none(self, requests) -> list[int]:
        """The batch's one best length for every request, except those whose plain decoding
        (0 drafts) makes the batch faster, coldest first: one block length per round, no mixing."""
        curves = [self.expected_curve(r) for r in requests]
        L = self._best(curves)
        lengths = [L] * len(requests)
        if L == 0:
            return lengths
        gains = [c[L] for c in curves]
        total = sum(gains)
        rate = total / self.round_s(lengths)
        for i in sorted(range(len(requests)), key=gains.__getitem__)[:-1]:  # the warmest keeps drafting
            trial = lengths[:i] + [0] + lengths[i + 1:]
            r = (total - gains[i] + 1.0) / self.round_s(trial)
            if r <= rate:
                break
            lengths, rate, total = trial, r, total - gains[i] + 1.0
        return lengths

    def round_s(self, lengths: Sequence[int], block: int | None = None) -> float:
        """The modelled seconds of a round that verifies these draft lengths (the drafter drafting
        a block of `block`, default max(lengths) + 1): the target's part as start-up timed its
        shape, corrected by what rounds of that shape took since (`verify_scale`: a shape neither
        timed nor run from its neighbours'), and the drafter's pass (`drafter_s`)."""
        return self._verify_round_s(lengths) + self.drafter_s(len(lengths), block or max(lengths) + 1)

    def _verify_round_s(self, lengths: Sequence[int]) -> float:
        """round_s without the drafter's pass."""
        return self.cost.verify_s(lengths) * self.verify_scale(len(lengths), max(lengths) + 1)

    def verify_scale(self, batch: int, T: int) -> float:
        """The correction of the target's part of a round of `batch` requests and longest block T:
        what rounds of that shape took (or start-up timed) over the fit; for a shape neither run
        nor timed, the line between the nearest corrections of its batch size on either side in
        T (the nearest one past either end), and between the nearest batch sizes on either side
        when its own has none; 1.0 (the fit) before any.
        Not 1.0 for every unseen shape: the fit misses a whole batch size alike (at c = 16 in
        process on the shipped pair, the rounds of 16 requests took 1.05-1.33x the fit, the
        shorter the block the more), so an unseen shape looked 5-25% cheaper than its
        neighbours, and `auto` ran it to find out: of the first two auto curves after fixed 3
        and 4 drafts (an ad hoc trace at c = 16), 23% and 12% of the rounds' time went to shapes
        not run before; corrected from their neighbours, 6% and 1%."""
        scale = self.correction.get((batch, T))
        if scale is not None:
            return scale
        if self._by_batch_size != len(self.correction):  # a shape was added: rebuild the index
            self._by_batch = {}
            for b, t in sorted(self.correction):
                self._by_batch.setdefault(b, []).append(t)
            self._by_batch_size = len(self.correction)
        if not self._by_batch:
            return 1.0
        if batch in self._by_batch:
            return self._scale_along_T(batch, T)
        below = max((b for b in self._by_batch if b < batch), default=None)
        above = min((b for b in self._by_batch if b > batch), default=None)
        if below is None or above is None:
            return self._scale_along_T(above if below is None else below, T)
        w = (batch - below) / (above - below)
        return (1 - w) * self._scale_along_T(below, T) + w * self._scale_along_T(above, T)

    def _scale_along_T(self, batch: int, T: int) -> float:
        """verify_scale at a batch size with corrections: the line between its nearest blocks on
        either side of T, or the nearest one."""
        ts = self._by_batch[batch]
        i = bisect.bisect_left(ts, T)
        if i < len(ts) and ts[i] == T:
            return self.correction[(batch, T)]
        if i == 0 or i == len(ts):
            return self.correction[(batch, ts[0 if i == 0 else -1])]
        t0, t1 = ts[i - 1], ts[i]
        c0, c1 = self.correction[(batch, t0)], self.correction[(batch, t1)]
        return c0 + (c1 - c0) * (T - t0) / (t1 - t0)

    def drafter_s(self, batch: int, T: int) -> float:
        """The drafter's pass for a block of T: start-up's (VerifyCost.draft_s), corrected by what
        rounds of this shape took, else by the mean correction of this batch size's blocks."""
        if T <= 1:
            return 0.0
        scale = self.draft_correction.get((batch, T))
        if scale is None:
            seen = [v for (b, _), v in self.draft_correction.items() if b == batch]
            scale = sum(seen) / len(seen) if seen else 1.0
        return self.cost.draft_s(batch, T) * scale

    def observe_round(self, lengths: Sequence[int], seconds: float, drafting: float | None = None,
                      block: int | None = None, drafter: bool = True) -> None:
        """A round whose requests verified `lengths` took `seconds` (decode only), `drafting` of
        them the drafter's pass over a block of `block` (default max(lengths) + 1; not measured:
        as modelled). drafter=False: the drafter's pass is not learnt from (it did more than draft
        the block), the rest of the round is."""
        if not lengths or seconds <= 0:
            return
        B, T = len(lengths), max(lengths) + 1
        block = block or T
        modelled = self.cost.draft_s(B, block)
        if drafter and drafting is not None and block > 1 and drafting > 0 and modelled > 0:  # a fit may model none
            _decayed(self.draft_correction, (B, block), drafting / modelled, self.correction_decay)
        drafting = self.drafter_s(B, block) if drafting is None else drafting
        verify = self.cost.verify_s(lengths)
        if verify > 0:
            _decayed(self.correction, (B, T), max(seconds - drafting, 0.0) / verify, self.correction_decay)

    def _increments(self, request: int) -> list[float]:
        """prod_{j<=k} a_j for k = 1..K: the expected extra token of drafting slot k."""
        return _running_products(self.acceptance(request))

    def choose(self, requests, concurrency):
        """`best` (one length) or, on a packed runner, `best_or_none` / `best_per_request`
        ({request: length}); with probe_every, every n-th call drafts 2L + 1 (lossless like every
        other round) so that slots past the best length are observed."""
        self._choices += 1
        probe = bool(self.probe_every) and self._choices % self.probe_every == 0
        stretch = (lambda L: min(self.block_size - 1, 2 * L + 1)) if probe else (lambda L: L)
        if not self.cost.packed:
            return stretch(self.best(requests))
        if len(requests) == 1:
            lengths = [self.best(requests)]
        elif self.mixed:
            lengths = self.best_per_request(requests)
        else:
            lengths = self.best_or_none(requests)
        return {r: stretch(L) for r, L in zip(requests, lengths)}

    def trimmer(self, batch: int):
        """DraftPolicy.trimmer: `trim` for rounds of at most trim_batch requests."""
        return self.trim if batch <= self.trim_batch else None

    def trim(self, requests: list[int], lengths: list[int], confidence: torch.Tensor) -> list[int]:
        """Decoder.step's `trim`: the drafts are drafted (a block of max(lengths) + 1, as `choose`
        chose); each request verifies the prefix of its drafts (at most its length) that
        maximises the batch's expected tokens per second (`_best_prefixes`), its acceptance from
        its slots' confidences [B, max(lengths)]. The drafter's pass is paid whatever is verified:
        a round's seconds are round_s of the verified lengths and the drafted block."""
        B, longest = len(requests), max(lengths)
        z = torch.logit(confidence.double().clamp(1e-4, 1 - 1e-4))  # [B, longest]
        u = torch.tensor(self.confidence_slots[:longest], dtype=torch.float64)
        s = torch.tensor([self.shifts.get(r, 0.0) for r in requests], dtype=torch.float64)
        a = torch.sigmoid(u + self.confidence_weight * z + self.confidence_shift * s[:, None])  # [B, longest]
        inc = a.cumprod(1) * (torch.arange(longest) < torch.tensor(lengths)[:, None])  # [B, longest]
        drafter = self.drafter_s(B, longest + 1)  # round_s with the drafted block, once a trim
        return self._best_prefixes(inc.tolist(), lambda L: self._verify_round_s(L) + drafter)

    def observe_confidence(self, request: int, confidence: Sequence[float], accepted: int) -> None:
        """A trimmed round: `request` verified len(confidence) drafts of these confidences and the
        target accepted `accepted`; one gradient step of trim's acceptance model per slot observed."""
        shift = self.shifts.get(request, 0.0)
        for j in range(min(len(confidence), accepted + 1)):
            z, a = self._confidence_acceptance(j, confidence[j], shift)
            miss = (1.0 if j < accepted else 0.0) - a
            self.confidence_slots[j] += self.confidence_rate * miss
            self.confidence_weight += self.confidence_weight_rate * miss * z

    def _confidence_acceptance(self, slot: int, confidence: float, shift: float) -> tuple[float, float]:
        """(logit of the confidence, clamped as trim clamps it; trim's acceptance of that slot)."""
        c = min(max(confidence, 1e-4), 1 - 1e-4)
        z = math.log(c / (1 - c))
        return z, _sigmoid(self.confidence_slots[slot] + self.confidence_weight * z + self.confidence_shift * shift)

    def observe_unverified(self, request: int, first: int, confidence: Sequence[float]) -> None:
        """A trimmed round in which `request` accepted every draft it verified (`first` of them)
        and left the next len(confidence) slots unverified. Whether the target would have
        accepted them is unknown, and not at random: the trim keeps the slots the drafter is sure
        of, so the slot curve and the shift, learning from verified slots only, would learn the
        sure slots' acceptance and overrate long blocks (in process at c = 4 before this, `choose`
        expected 14.0 tokens a round from the blocks it chose; the trimmed rounds committed 10.8).
        Given its confidence a slot's trim is at random, so trim's acceptance model stands in for
        the target: each unverified slot is a soft observation, its label trim's acceptance and
        its weight the chance that every draft before it is accepted; one gradient step each, as
        `observe` takes."""
        b, seen = self.slot_logits, self.slot_seen
        s, reach = self.shifts.get(request, 0.0), 1.0
        for j, c in enumerate(confidence, start=first):
            _, label = self._confidence_acceptance(j, c, s)
            miss = reach * (label - _sigmoid(b[j] + s))
            s += self.request_rate * miss
            b[j] += max(self.slot_rate, 1.0 / (self.prior_weight + seen[j])) * miss
            seen[j] += reach
            reach *= label
        self.shifts[request] = s

    def choose_tree(self, requests, concurrency):
        """A DDTree decoder's round: the tree budget of highest expected tokens per second, or a
        chain round (`choose`'s lengths, budget 0) when no tree beats it. Without tree_budgets,
        the deployment's trees at full depth."""
        if not self.tree_budgets or not requests:
            return None, None
        chain = self.choose(requests, concurrency)
        lengths = [chain.get(r, 0) for r in requests] if isinstance(chain, dict) else [chain] * len(requests)
        chain_rate = sum(self.expected_tokens(r, L) for r, L in zip(requests, lengths)) / self.round_s(lengths)
        B = len(requests)
        rates = {n: B * self.tree_tokens_of(n) / self.tree_round_s(B, n) for n in self.tree_budgets}
        best = max(rates, key=rates.get)
        if rates[best] > chain_rate:
            return self.block_size - 1, best
        return chain, 0

    def tree_tokens_of(self, budget: int) -> float:
        """Tokens a tree round of `budget` nodes commits per request: the observed mean, or, before
        any, a chain of the whole block plus one (optimistic, so that it gets tried)."""
        if budget in self.tree_tokens:
            return self.tree_tokens[budget]
        return 2.0 + sum(_running_products(self.population))

    def tree_round_s(self, batch: int, budget: int) -> float:
        """Modelled seconds of a tree round: every row verifies budget + 1 tokens (trees are padded
        to the largest), corrected by what tree rounds of this shape took."""
        return self.cost.round_s(batch, budget) * self.tree_correction.get((batch, budget), 1.0)

    def learn(self, rec, seconds=None):
        """observe_round (with `seconds`), then observe every request that goes on: a request's
        last round commits only what it had left, not what was accepted. A tree round teaches its
        budget's tokens per request and, through StepRecord.chain, the chain estimates.
        The drafter's pass is not learnt from in the first round that drafts after a request
        joined (a tree round's time not at all): the drafter then also projects that request's
        prompt into its context (perf/bench_drafter_context: at 16 requests 1.2x the steady pass,
        1.5x at one), a cost of the request's arrival, paid whatever length the round drafts.
        Learnt as the cost of the shape that happened to run, the rounds that admitted a whole
        batch left a 3.3x drafter correction on a shape seen once (c = 16 in process), which then
        looked too dear to run again."""
        going = [i for i, done in enumerate(rec.finished) if done is None]
        drafted = bool(rec.tree_budget) or rec.block > 1 or max(rec.drafted, default=0) > 0
        joined = drafted and not self.projected.issuperset(rec.seq_ids)
        if drafted:
            self.projected.update(rec.seq_ids[i] for i in going)
        if rec.tree_budget:
            n, key = rec.tree_budget, (len(rec.seq_ids), rec.tree_budget)
            if seconds is not None and seconds > 0 and not joined:
                _decayed(self.tree_correction, key, seconds / self.cost.round_s(*key), self.correction_decay)
            if going:
                _decayed(self.tree_tokens, n, sum(len(rec.tokens[i]) for i in going) / len(going), self.tree_decay)
            for i in going if rec.chain is not None else ():
                self.observe(rec.seq_ids[i], *rec.chain[i])
            return
        if seconds is not None:  # a trimmed round paid the drafter for its block, not for what it verified
            self.observe_round(rec.drafted, seconds, rec.t_draft or None, rec.block or None, drafter=not joined)
        for i in going:
            request, verified, accepted = rec.seq_ids[i], rec.drafted[i], len(rec.tokens[i]) - 1
            self.observe(request, verified, accepted)
            if rec.confidence is not None:
                self.observe_confidence(request, rec.confidence[i][:verified], accepted)
                if accepted == verified:
                    self.observe_unverified(request, verified, rec.confidence[i][verified:])

    def observe(self, request, drafted, accepted):
        """A round in which `request` drafted `drafted` and the target accepted `accepted`: slots
        1..accepted were accepted given their predecessors, slot accepted + 1 rejected (a chain
        round: drafted <= block_size - 1). One gradient step of the log-likelihood per slot."""
        s = self.shifts.get(request, 0.0)
        if drafted == 0:
            # Nothing observed. A request that drafts nothing would keep its low shift for good
            # (per-request lengths: the others go on drafting); it drifts back to the curve instead,
            # and drafts again when that says drafting pays.
            self.shifts[request] = self.decay * s
            return
        b, seen = self.slot_logits, self.slot_seen
        for j in range(min(drafted, accepted + 1, len(b))):
            miss = (1.0 if j < accepted else 0.0) - _sigmoid(b[j] + s)
            s += self.request_rate * miss
            b[j] += max(self.slot_rate, 1.0 / (self.prior_weight + seen[j])) * miss
            seen[j] += 1.0
        self.shifts[request] = s

    def forget(self, request):
        self.shifts.pop(request, None)
        self.projected.discard(request)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _running_products(acceptances: Sequence[float]) -> list[float]:
    """prod_{j<=k} a_j for k = 1..len: the chance that slot k and every slot before it is accepted."""
    out, run = [], 1.0
    for a in acceptances:
        run *= a
        out.append(run)
    return out


def _prefix_above(row: Sequence[float], limit: int, threshold: float) -> int:
    """How many of row's first `limit` entries (non-increasing) exceed threshold."""
    n = 0
    while n < limit and row[n] > threshold:
        n += 1
    return n


def _decayed(table: dict, key, value: float, decay: float) -> None:
    """table[key] <- value the first time, then the decayed mean decay * old + (1 - decay) * value."""
    old = table.get(key)
    table[key] = value if old is None else decay * old + (1 - decay) * value


def tree_budget_menu(budget: int | None) -> tuple[int, ...]:
    """The node budgets `auto` chooses DDTree rounds from: the deployment's, its half and its quarter."""
    if not budget:
        return ()
    return tuple(sorted({n for n in (budget, budget // 2, budget // 4) if n >= 1}, reverse=True))


def measure_cost(decoder_factory, block_size: int, vocab_size: int, batches: Sequence[int] = (1, 4),
                 prompt_len: int = 32, repeats: int = 5) -> VerifyCost:
    """Time rounds of a fresh decoder at a few batch sizes and every draft length and fit VerifyCost
    by least squares. Each shape's time is the fastest of `repeats` rounds after a warm-up (on a
    shared machine other work only adds time); the median of each uniform shape is kept as is
    (VerifyCost.timed). decoder_factory(max_len) -> a greedy Decoder-like
    object; one whose `packed` is True is also timed with half its rows at 0 drafts, which
    separates per_token from per_slot."""
    rows, times, timed, timed_draft = [], [], {}, {}
    g = torch.Generator().manual_seed(0)
    lengths = range(block_size)
    packed = bool(getattr(decoder_factory(prompt_len + 1), "packed", False))
    shapes = [[L] * B for B in batches for L in lengths]
    if packed:
        shapes += [[L, 0] * (max(batches) // 2) for L in sorted({1, block_size // 4, block_size // 2, block_size - 1})]
    for shape in shapes:
        B, n = len(shape), 4 * block_size * (repeats + 1)
        decoder = decoder_factory(prompt_len + n)
        prompts = torch.randint(0, vocab_size, (B, prompt_len), generator=g).tolist()
        decoder.admit(list(range(B)), prompts, [n] * B, [[]] * B)
        decoder.step(shape)  # warm-up
        took, drafting = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            drafting.append(decoder.step(shape).t_draft)
            took.append(time.perf_counter() - t0)
        times.append(min(took))
        T = max(shape) + 1
        if len(set(shape)) == 1:
            timed[(B, T)] = sorted(took)[len(took) // 2]
            timed_draft[(B, T)] = sorted(drafting)[len(drafting) // 2]
        rows.append([1.0, sum(L + 1 for L in shape) if packed else B * T, 1.0 if T > 1 else 0.0] + ([B * T] if packed else []))
    sol = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64), torch.tensor(times, dtype=torch.float64)[:, None]).solution
    fixed, per_token, draft, *per_slot = (max(0.0, float(x)) for x in sol[:, 0])
    return VerifyCost(fixed, per_token, draft, per_slot[0] if packed else 0.0, packed, timed, timed_draft)
