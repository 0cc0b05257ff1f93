"""One spoken turn through /v1/realtime with the `websockets` client, sending the events
OpenAI's Realtime API documents (pcm16, 24 kHz, base64) and checking what comes back.

Environment: ADDR (host:port), KEY (the API key), QUESTION (a raw pcm16 24 kHz file of a
spoken question). Prints "ok" at the end.
"""

import base64
import json
import os
import sys
import time

from websockets.sync.client import connect
from websockets.exceptions import InvalidStatus

ADDR, KEY = os.environ["ADDR"], os.environ["KEY"]
URL = f"ws://{ADDR}/v1/realtime?model={os.environ['MODEL']}"
AUTH = {"Authorization": f"Bearer {KEY}"}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def recv(ws, until, timeout=240.0):
    """Events up to and including the first whose type is `until`."""
    out = []
    end = time.time() + timeout
    while time.time() < end:
        ev = json.loads(ws.recv(timeout=max(0.1, end - time.time())))
        out.append(ev)
        if ev["type"] == until:
            return out
    fail(f"no {until} within {timeout} s; got {[e['type'] for e in out]}")


# the same authentication as the other routes
try:
    with connect(URL, open_timeout=10) as ws:
        fail("connected without the API key")
except InvalidStatus as e:
    assert e.response.status_code == 401, e.response.status_code

with connect(URL, additional_headers=AUTH, open_timeout=10, max_size=None) as ws:
    created = json.loads(ws.recv(timeout=30))
    assert created["type"] == "session.created", created
    assert created["session"]["input_audio_format"] == "pcm16"

    # malformed and unknown events are answered with `error`, the session goes on
    ws.send(json.dumps({"type": "no.such.event", "event_id": "evt_1"}))
    err = recv(ws, "error")[-1]
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["event_id"] == "evt_1", err
    ws.send(json.dumps({"type": "session.update", "session": {"voice": "nobody"}}))
    err = recv(ws, "error")[-1]
    assert "voice" in err["error"]["message"], err

    ws.send(json.dumps({"type": "session.update", "session": {
        "instructions": "You are a helpful voice assistant. Answer in one short sentence.",
        "voice": "jm_kumo",
        "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500},
        "max_response_output_tokens": 40,
    }}))
    updated = recv(ws, "session.updated")[-1]
    assert updated["session"]["turn_detection"]["silence_duration_ms"] == 500, updated

    # the question, then a second of silence, in 100 ms appends
    pcm = open(os.environ["QUESTION"], "rb").read() + bytes(2 * 24000)
    step = 2 * 2400
    for i in range(0, len(pcm), step):
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i:i + step]).decode()}))

    events = recv(ws, "response.done")
    types = [e["type"] for e in events]
    print(" ".join(t for t in types if t not in ("response.audio.delta", "response.audio_transcript.delta")))
    errors = [e for e in events if e["type"] == "error"]
    assert not errors, errors

    def first(t):
        if t not in types:
            fail(f"no {t} in {types}")
        return types.index(t)

    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
             "conversation.item.input_audio_transcription.completed", "response.created", "response.output_item.added",
             "response.audio_transcript.delta", "response.audio.delta", "response.audio.done",
             "response.audio_transcript.done", "response.output_item.done", "response.done"]
    idx = [first(t) for t in order]
    assert idx == sorted(idx), list(zip(order, idx))

    started = events[first("input_audio_buffer.speech_started")]
    committed = events[first("input_audio_buffer.committed")]
    transcript = events[first("conversation.item.input_audio_transcription.completed")]
    assert started["item_id"] == committed["item_id"] == transcript["item_id"]
    heard = transcript["transcript"].lower()
    assert "capital" in heard and "france" in heard, heard

    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.audio.delta")
    seconds = len(audio) / 2 / 24000
    text = "".join(e["delta"] for e in events if e["type"] == "response.audio_transcript.delta")
    done = events[-1]["response"]
    assert done["status"] == "completed", done
    assert done["output"][0]["content"][0]["transcript"] == text.strip(), (done, text)
    assert seconds > 0.5, seconds
    assert done["usage"]["output_tokens"] > 0, done["usage"]
    print(f"heard {heard!r}; answered {text.strip()!r} with {seconds:.2f} s of audio")

    # a text turn, answered on request, then a cancel with nothing left to cancel
    ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": "Say hello."}]}}))
    assert recv(ws, "conversation.item.created")[-1]["item"]["role"] == "user"
    ws.send(json.dumps({"type": "response.create"}))
    second = recv(ws, "response.done")
    assert second[-1]["response"]["status"] == "completed", second[-1]
    ws.send(json.dumps({"type": "response.cancel", "event_id": "evt_2"}))
    err = recv(ws, "error")[-1]
    assert err["error"]["code"] == "response_cancel_not_active", err

print("ok")
