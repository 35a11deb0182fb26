"""GPU, end to end: requests at the edges -- an empty prompt, ``max_new_tokens`` 0 and 1, a stop string and a
stop token that fall inside an accepted draft, a request aborted mid-way -- served by a LUMOTREE_SUFFIX and a
LUMOTREE server on the committed tiny model as the server without speculation serves them: the same answer
kind (an HTTP error or an answer), the same finish reason, the same lengths; where the output is fixed by the
prefill alone (one new token), the same token. A stop inside a draft: the output ends where the server's own
unstopped output first meets the stop (speculative steps accept several tokens at once, so the cut must fall
inside a step). After the abort the server answers the next request as before it."""
import json
import os
import sys
import urllib.error
import urllib.request

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "serving"))

# repetitive code: suffix drafts are accepted several tokens per step
PROMPT = "import os\nimport sys\nimport re\nimport json\nimport time\nimport math\nimport os\nimport sys\n"
LONG = 96


def _generate(url, text, params, rid=None):
    """``(status, body)`` of one /generate call: 200 and SGLang's answer, or the HTTP error's code and text."""
    from sglang_server import post

    payload = {"text": text, "sampling_params": dict(temperature=0.0, **params)}
    if rid is not None:
        payload["rid"] = rid
    try:
        return 200, post(url + "/generate", payload)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


ABORT_AFTER_MAX = 4000  # the aborted request's max_new_tokens: it must end long before


def _aborted_mid_way(url, text, max_new_tokens, rid="edge-abort"):
    """Streams one greedy request and aborts it (``/abort_request``) as soon as a chunk with output arrived;
    ``(status, finish reason of the last chunk -- or "error" --, whether it ended before max_new_tokens)``."""
    from sglang_server import post

    payload = {"text": text, "rid": rid, "stream": True,
               "sampling_params": dict(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True)}
    req = urllib.request.Request(url + "/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    last, sent = None, False
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[len(b"data:"):].strip()
                if data == b"[DONE]":
                    break
                last = json.loads(data)
                if "error" in last:
                    break
                if not sent and last.get("meta_info", {}).get("completion_tokens", 0) > 0:
                    post(url + "/abort_request", {"rid": rid})
                    sent = True
    except urllib.error.HTTPError as e:
        return (e.code,)
    if last is None or "error" in last:
        return 200, "error", False
    return 200, _reason(last), last["meta_info"]["completion_tokens"] < max_new_tokens


def _chat(url, content, max_tokens):
    from sglang_server import post

    try:
        return 200, post(url + "/v1/chat/completions", dict(model="m", temperature=0.0, max_tokens=max_tokens,
                                                             messages=[dict(role="user", content=content)]))
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _kind(status, body):
    """What must match between servers: the status, and for answers the finish reason's type, the length."""
    if status != 200:
        return (status,)
    if "choices" in body:  # OpenAI chat
        ch = body["choices"][0]
        return 200, ch.get("finish_reason"), body["usage"]["completion_tokens"]
    return 200, _reason(body), body["meta_info"]["completion_tokens"]


def _reason(body):
    return (body.get("meta_info", {}).get("finish_reason") or {}).get("type") if isinstance(body, dict) else None


def _first_new(seq, k):
    """The latest-starting window of ``k`` items whose first occurrence in ``seq`` is in its second half (else
    after the 4th item, else after the first): a stop met as late as the output allows -- the tiny model's
    greedy output can be a short cycle, where every token first occurs in the first verify step."""
    for start in (len(seq) // 2, 4, 1):
        for i in range(len(seq) - k, start - 1, -1):
            w = seq[i:i + k]
            first = seq.find(w) if isinstance(seq, str) else next(
                p for p in range(len(seq)) if seq[p:p + k] == w)
            if first == i and (not isinstance(w, str) or w.strip()):
                return w if isinstance(seq, str) else i
    raise AssertionError(f"no window of {k} met first after the first item in {seq!r}")


def probe(url):
    out = {}
    out["empty_text"] = _kind(*_generate(url, "", dict(max_new_tokens=8)))
    out["empty_chat"] = _kind(*_chat(url, "", 8))
    out["max_new_tokens_0"] = _kind(*_generate(url, PROMPT, dict(max_new_tokens=0)))
    status, one = _generate(url, PROMPT, dict(max_new_tokens=1))
    out["max_new_tokens_1"] = _kind(status, one)
    out["one_token"] = one["output_ids"] if status == 200 else None

    # the server's own unstopped greedy output, then the same request stopped inside it
    status, full = _generate(url, PROMPT, dict(max_new_tokens=LONG, ignore_eos=True))
    assert status == 200, full
    text, ids = full["text"], full["output_ids"]
    stop = _first_new(text, 8)  # a stop string met late in the output (inside a step that accepted several tokens)
    status, cut = _generate(url, PROMPT, dict(max_new_tokens=LONG, ignore_eos=True, stop=[stop]))
    out["stop_string"] = (status, cut["text"] == text[:text.find(stop)] if status == 200 else cut, _reason(cut))
    # a stop token id: what SGLang does with EOS-like tokens is checked with EOS on, so the reference is too
    status, ref = _generate(url, PROMPT, dict(max_new_tokens=LONG))
    assert status == 200, ref
    rids = ref["output_ids"]
    j = _first_new(rids, 1)
    status, cut = _generate(url, PROMPT, dict(max_new_tokens=LONG, stop_token_ids=[rids[j]]))
    # whether the matched token is kept is SGLang's rule; the cut is at its first occurrence either way
    out["stop_token"] = (status, cut["output_ids"] in (rids[:j + 1], rids[:j]) if status == 200 else cut,
                         _reason(cut))
    out["stop_token_kept"] = status == 200 and cut["output_ids"] == rids[:j + 1]

    # a request aborted mid-way (streamed; the abort sent once its first tokens arrived: a request drafted from a
    # repetitive output can reach any fixed max_new_tokens before a timed abort), then the same unstopped request again
    out["aborted"] = _aborted_mid_way(url, PROMPT * 4, ABORT_AFTER_MAX)
    status, again = _generate(url, PROMPT, dict(max_new_tokens=LONG, ignore_eos=True))
    out["after_abort_same_output"] = status == 200 and again["output_ids"] == ids
    return out


@pytest.fixture(scope="module")
def none_probe(tmp_path_factory):
    from sglang_server import sglang_server

    model = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    log = tmp_path_factory.mktemp("none") / "server.log"
    with sglang_server(model, ["--cuda-graph-max-bs", "8"], port=port, log=str(log), timeout=400) as url:
        return probe(url)


@pytest.mark.parametrize("args", [
    ["--speculative-algorithm", "LUMOTREE_SUFFIX"],
    ["--speculative-algorithm", "LUMOTREE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
     "--speculative-num-draft-tokens", "6"],
], ids=["suffix", "mtp-tree"])
def test_edge_requests_served_as_without_speculation(tmp_path, none_probe, args):
    from sglang_server import sglang_server

    model = os.path.join(ROOT, "benchmark", "models", "tiny-hybrid")
    port = int(os.environ.get("LUMOTREE_TEST_PORT", "30000"))
    with sglang_server(model, [*args, "--cuda-graph-max-bs", "8"], port=port, log=str(tmp_path / "server.log"),
                       timeout=400) as url:
        got = probe(url)
    print(json.dumps(dict(none=none_probe, speculative=got), default=str))
    for case in ("empty_text", "empty_chat", "max_new_tokens_0", "max_new_tokens_1", "aborted"):
        assert got[case] == none_probe[case], case
    assert got["one_token"] == none_probe["one_token"]  # the prefill's token: the same kernels in both
    for server in (none_probe, got):
        assert server["stop_string"] == (200, True, "stop"), server["stop_string"]
        assert server["stop_token"] == (200, True, "stop"), server["stop_token"]
        assert server["aborted"] == (200, "abort", True), server["aborted"]  # ended by the abort, mid-way
        assert server["after_abort_same_output"]
    assert got["stop_token_kept"] == none_probe["stop_token_kept"]
