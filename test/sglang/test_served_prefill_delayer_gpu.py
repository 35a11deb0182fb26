"""GPU, end to end: a LUMOTREE_SUFFIX server with its default prefill delayer
(:func:`lumotree.sglang.scheduling.default_prefill_delayer`) and LumoTree's delayer hooks
(:mod:`lumotree.sglang.patches.prefill_delayer_gather`, :mod:`~lumotree.sglang.patches.prefill_delayer_idle`,
:mod:`~lumotree.sglang.patches.prefill_delayer_early`) while the delayer holds prefills: closed-loop clients whose next requests arrive one at a time while the others decode.

Eight clients start at once (one prefill batch of eight: SGLang's ``max_prefill_bs`` 8) on a server of eight request
slots, so each later request arrives with one slot free and SGLang's slot trigger holds it (``8 - 7 < 8``) for up to
its 30 passes or until more slots free. A ninth request, sent while all slots run, is aborted while it waits or runs.
Must hold: the delayer held (SGLang's ``sglang:prefill_delayer_outcomes_total`` counts ``delay`` verdicts -- without
holds the test would check nothing), every client request answered in full (200, finish reason ``length``, its
``max_new_tokens``), the aborted request ended as aborted, and afterwards the server's greedy answer to a prompt is
the answer it gave before the burst (no state lost or mixed up by held passes)."""
import os
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "serving"))
sys.path.insert(0, os.path.dirname(__file__))
MODEL = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")

CLIENTS = 8
TURNS = 5
LONG = 96


def _delay_verdicts(metrics: str) -> float:
    """The ``delay`` verdicts SGLang's metrics counted (every label set of the outcomes counter)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("sglang:prefill_delayer_outcomes_total{") and 'output_reason="delay"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_delayer_holds_and_every_request_is_served(tmp_path):
    from sglang_server import get, post, sglang_server
    from test_served_edge_requests_gpu import PROMPT, _generate, _reason

    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    args = ["--speculative-algorithm", "LUMOTREE_SUFFIX", "--cuda-graph-max-bs", "8",
            "--max-running-requests", str(CLIENTS), "--enable-metrics"]
    log = tmp_path / "server.log"
    with sglang_server(MODEL, args, port=port, log=str(log), timeout=400) as url:
        status, before = _generate(url, PROMPT, dict(max_new_tokens=LONG, ignore_eos=True))
        assert status == 200, before
        held_before = _delay_verdicts(get(url + "/metrics").decode())

        results, lock = [], threading.Lock()
        start = threading.Barrier(CLIENTS)

        def client(i):
            start.wait()
            for t in range(TURNS):
                n = 16 + 8 * ((3 * i + t) % 6)  # lengths that differ, so the clients' turns end apart
                status, body = _generate(url, f"{PROMPT}# client {i} turn {t}\n",
                                         dict(max_new_tokens=n, ignore_eos=True))
                with lock:
                    results.append((i, t, n, status, _reason(body),
                                    body["meta_info"]["completion_tokens"] if status == 200 else body))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for th in threads:
            th.start()
        time.sleep(0.3)
        box = {}
        aborted = threading.Thread(target=lambda: box.update(r=_generate(
            url, PROMPT * 3, dict(max_new_tokens=4000, ignore_eos=True), rid="delayer-abort")))
        aborted.start()
        deadline = time.time() + 60
        while aborted.is_alive() and time.time() < deadline:  # until the server knew the rid (an abort before is lost)
            time.sleep(0.05)
            post(url + "/abort_request", {"rid": "delayer-abort"})
            aborted.join(0.2)
        for th in threads:
            th.join(300)
        assert not aborted.is_alive() and not any(th.is_alive() for th in threads), "a request did not end"
        held = _delay_verdicts(get(url + "/metrics").decode()) - held_before
        status, after = _generate(url, PROMPT, dict(max_new_tokens=LONG, ignore_eos=True))

    log_text = log.read_text(errors="replace")
    assert "Traceback" not in log_text, log_text[log_text.find("Traceback"):][:3000]
    print(dict(delay_verdicts=held, requests=len(results)))
    assert held > 0, "the delayer never held a prefill: this test served nothing it is meant to check"
    assert len(results) == CLIENTS * TURNS
    for i, t, n, status, reason, got in results:
        assert (status, reason, got) == (200, "length", n), (i, t, n, status, reason, got)
    status_a, body_a = box["r"]
    assert status_a != 200 or _reason(body_a) == "abort", (status_a, str(body_a)[:500])
    if status_a == 200:
        assert body_a["meta_info"]["completion_tokens"] < 4000
    assert status == 200 and after["output_ids"] == before["output_ids"]
