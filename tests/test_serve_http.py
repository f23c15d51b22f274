"""`veloxquant serve` as a separate process on 127.0.0.1 (tiny Gemma 3, the default configuration), over HTTP
(issue 21): each bad input gets a 4xx with a message in the caller's terms and the next good request is served;
/v1/models lists the served model; a client that goes away (streamed or not) stops its request and leaves one log line,
no traceback; SIGTERM in the middle of a generation ends the server with status 0. Every wait is on an event with a
generous timeout; nothing asserts how long anything took."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import json, os, re, signal, socket, subprocess, sys, threading, time, urllib.parse
from pathlib import Path
import pytest
from veloxquant_mlx.serve import bad_inputs, refusal_table, table_markdown, http_json

GOOD = {"prompt": "The pass key is 52817. Remember it. " * 6, "max_tokens": 4, "temperature": 0.0}
SERVER_ARGS = ("--max-prompt-tokens", "2048", "--max-tokens-limit", "4000")
REFUSALS = Path(__file__).resolve().parents[1] / "nbs" / "results" / "serve_refusals.json"   # the serving page's table

class Server:
    "`veloxquant serve ARGS --port 0` in a child process, its stderr kept line by line."
    def __init__(self, *args, timeout=300):
        cmd = [sys.executable, "-c", "import sys; from veloxquant_mlx.cli import main; sys.exit(main())", "serve",
               "--model", "tiny:gemma3", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.lines, self.new_line, self.eof = [], threading.Condition(), False
        threading.Thread(target=self._read, daemon=True).start()
        m = self.wait_for(r" on (http://\S+)", timeout)
        self.url = m.group(1)

    def _read(self):
        for line in self.proc.stderr:
            with self.new_line:
                self.lines.append(line)
                self.new_line.notify_all()
        with self.new_line:
            self.eof = True
            self.new_line.notify_all()

    def wait_for(self, pattern, timeout=300):
        "The first log line matching `pattern` (waits for it); fails with the log if none comes."
        deadline = time.monotonic() + timeout
        with self.new_line:
            while True:
                for line in self.lines:
                    m = re.search(pattern, line)
                    if m: return m
                left = deadline - time.monotonic()
                if left <= 0 or self.eof:
                    pytest.fail(f"no log line matching {pattern!r}:\n" + "".join(self.lines[-40:]))
                self.new_line.wait(min(left, 5))

    @property
    def log(self): return "".join(self.lines)

    def stop(self, sig=signal.SIGINT, patience=600):
        "Send `sig`; the exit status once it ended (None: still running after `patience` s, then killed)."
        if self.proc.poll() is None: self.proc.send_signal(sig)
        try: return self.proc.wait(timeout=patience)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

def raw_post(url, body:dict):
    "Send one POST on a raw socket and return the socket (the caller reads or closes it)."
    u = urllib.parse.urlparse(url)
    s = socket.create_connection((u.hostname, u.port), timeout=600)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s

@pytest.fixture(scope="module")
def server():
    srv = Server(*SERVER_ARGS, "--", "--log-level", "WARNING")
    yield srv
    srv.stop()

def test_bad_inputs_get_4xx_and_the_server_goes_on(server):
    rows = refusal_table(server.url, bad_inputs(4096, 2048), GOOD)
    print("\n" + table_markdown(rows))
    assert [r["status"] for r in rows] == [400, 400, 400, 400, 400, 404, 400, 400, 400, 400]
    assert all(r["next_served"] for r in rows)
    msgs = [r["message"] for r in rows]
    assert "longer than this server's limit of 2048" in msgs[0] and "4196 tokens" in msgs[0]
    assert "`messages` must be a non-empty list" in msgs[2] and "`messages[0].content`" in msgs[3]
    assert "got 'hi'" in msgs[4] and "'gpt-4o' is not served" in msgs[5] and "at most 4000" in msgs[6]
    assert "`prompt` must be a non-empty string" in msgs[7] and "Invalid JSON" in msgs[8]
    assert "too short for this server's cache configuration" in msgs[9]
    assert "Traceback" not in server.log
    if os.environ.get("VQ_WRITE_RESULTS"):                 # refresh the page's table from this run
        cmd = "veloxquant serve --model tiny:gemma3 --port 0 " + " ".join(SERVER_ARGS)
        REFUSALS.write_text(json.dumps(dict(command=cmd, good=GOOD, rows=rows), indent=1) + "\n")
    saved = json.loads(REFUSALS.read_text())
    assert saved["rows"] == rows, (f"the serving page's refusal table ({REFUSALS.name}) is not what the server "
                                   "answers now: rerun this test with VQ_WRITE_RESULTS=1 and commit the file\n"
                                   + table_markdown(rows))

def test_models_lists_the_served_model(server):
    status, answer = http_json(server.url, "/v1/models")
    assert status == 200 and [m["id"] for m in answer["data"]] == ["tiny:gemma3"]
    assert http_json(server.url, "/v1/models/tiny:gemma3")[0] == 200
    assert http_json(server.url, "/v1/models/gpt-4o")[0] == 404

def test_startup_warns_of_no_chat_template(server):
    server.wait_for("has no chat template")

@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_goes_away_stops_its_request(server, stream):
    n = len(re.findall("went away", server.log))
    s = raw_post(server.url, {**GOOD, "max_tokens": 4000, "stream": stream})
    if stream: s.recv(1)                                  # the answer has started
    s.close()
    deadline = time.monotonic() + 600
    while len(re.findall("went away", server.log)) == n:  # waits for the event, asserts no time
        assert time.monotonic() < deadline, "no 'went away' line:\n" + server.log[-3000:]
        time.sleep(0.2)
    assert "Traceback" not in server.log
    assert http_json(server.url, "/v1/completions", GOOD)[0] == 200

def test_sigterm_mid_generation_ends_the_server():
    srv = Server("--max-tokens-limit", "4000", "--", "--log-level", "WARNING")
    try:
        s = raw_post(srv.url, {**GOOD, "max_tokens": 4000, "stream": True})
        s.recv(1)                                         # generating now
        code = srv.stop(signal.SIGTERM)
        s.close()
    finally: srv.stop(signal.SIGKILL, 60)
    assert code == 0, f"after SIGTERM the server ended with {code} (None: still running after 10 minutes)"
