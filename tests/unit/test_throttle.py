from core.throttle import throttled


def test_calls_closer_than_the_interval_are_dropped_but_the_last_one_goes_through():
    now = [0.0]
    seen = []
    call = throttled(lambda f, m: seen.append(f), interval_s=0.25, is_last=lambda f, m: f >= 1.0,
                     clock=lambda: now[0])
    for i in range(10):  # one call every 0.1 s
        now[0] = i * 0.1
        call(i / 10, "step")
    now[0] += 0.01
    call(1.0, "done")
    assert seen == [0.0, 0.3, 0.6, 0.9, 1.0]
