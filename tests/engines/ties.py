"""Greedy tokens of two numerically different paths (same weights, other summation orders) are equal up to the first
near-tie: logits come out of lm_head in BF16, whose step at these magnitudes (|logit| 16-32) is 0.125, so two
candidates one step apart can swap under any change of rounding order, and after a swap the texts go their own ways."""

TIE_NATS = 0.13  # one BF16 step of the logits, and a little


def margin(top: dict[int, float]) -> float:
    best = sorted(top.values(), reverse=True)
    return best[0] - best[1] if len(best) > 1 else float("inf")


def assert_same_tokens_until_a_tie(gens_a, gens_b) -> int:
    """Each pair of generations agrees token for token, or parts where either path's top two were within TIE_NATS;
    returns how many parted (the caller bounds it). Needs top_logprobs >= 2."""
    parted = 0
    for a, b in zip(gens_a, gens_b, strict=True):
        i = common_prefix(a.token_ids, b.token_ids)
        if i < min(len(a.token_ids), len(b.token_ids)):
            near = min(margin(a.top_logprobs[i]), margin(b.top_logprobs[i]))
            assert near <= TIE_NATS, f"parted at token {i} with a margin of {near:.3f} nats: not a near-tie"
            parted += 1
    return parted


def common_prefix(ids_a, ids_b) -> int:
    """How many leading tokens two generations share."""
    n = 0
    for x, y in zip(ids_a, ids_b):
        if x != y:
            break
        n += 1
    return n
