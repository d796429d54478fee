"""A stand-in for the native ``bmoe-cli``: follows its flags, protocol and files, fast.

Standard library only (it runs wherever the tests put it, over sh, adb or ssh). Behaviour
for the tests comes through flags the real engine does not have, which a driver passes
through like any unknown flag:

--fake-mode ok|crash|crash-once|hang|badutf8   --fake-state DIR (crash-once's memory)
--fake-delay S (seconds per token)   --fake-jitter J (each run's token times x (1 + J * U[0,1)))
-h / --help lists the flags it takes, as the native engine's help does; --version alone
prints a version line.
"""

import json
import os
import select
import signal
import sys
import time

KNOWN = {
    "-m": 1, "--model": 1, "-p": 1, "--prompt": 1, "-n": 1, "--n-predict": 1, "-t": 1,
    "--threads": 1, "-c": 1, "--ctx-size": 1, "--ubatch": 1, "--n-expert-used": 1,
    "--temp": 1, "--top-k": 1, "--top-p": 1, "--seed": 1, "--progress": 0, "--session": 0,
    "--csv": 1, "--route-trace": 1, "--compute-trace": 1, "--compute-trace-layers": 1,
    "--io-trace": 1, "--moe-stream": 0, "--cache-mb": 1, "--io-threads": 1, "--no-odirect": 0,
    "--load-all": 0, "--prefetch": 1, "--dense-weights": 1, "--chatml": 0, "--no-think": 0,
    "--overlap": 0, "--fake-mode": 1, "--fake-state": 1, "--fake-delay": 1, "--fake-jitter": 1,
}  # fmt: skip


def usage():
    lines = ["usage: bmoe-cli -m MODEL [options]"]
    lines += [f"  {flag}{' VALUE' if takes else ''}" for flag, takes in KNOWN.items()]
    sys.stdout.write("\n".join(lines) + "\n  -h, --help\n")


def parse(argv):
    if "-h" in argv or "--help" in argv:
        usage()
        sys.exit(0)
    if argv == ["--version"]:
        sys.stdout.write("fake-bmoe-cli 0.1 (build stand-in)\n")
        sys.exit(0)
    opts = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag not in KNOWN:
            sys.stderr.write(f"error: unknown argument: {flag}\n")
            sys.exit(2)
        if KNOWN[flag]:
            if i + 1 >= len(argv):
                sys.stderr.write(f"error: {flag} needs a value\n")
                sys.exit(2)
            opts[flag] = argv[i + 1]
            i += 2
        else:
            opts[flag] = True
            i += 1
    return opts


def get(opts, *names, default=None):
    for name in names:
        if name in opts:
            return opts[name]
    return default


out = sys.stdout.buffer


def emit(tag, data, raw_text=b""):
    body = json.dumps(data, separators=(",", ":"))
    if raw_text:
        # Raw bytes inside the JSON string, as the native engine cuts text at token boundaries.
        body = body[:-1] + ',"delta_text":"' + "\x00" + '"}'
        head, tail = body.split("\x00")
        line = b"BMOE_" + tag.encode() + b" " + head.encode() + raw_text + tail.encode()
    else:
        line = f"BMOE_{tag} {body}".encode()
    out.write(line + b"\n")
    out.flush()


def main():
    opts = parse(sys.argv[1:])
    sys.stderr.write("FAKE_ARGV " + json.dumps(sys.argv[1:]) + "\n")
    sys.stderr.flush()
    model = get(opts, "-m", "--model")
    if not model or not os.path.isfile(model):
        sys.stderr.write(f"error: cannot open model {model!r}\n")
        sys.exit(1)
    mode = get(opts, "--fake-mode", default="ok")
    delay = float(get(opts, "--fake-delay", default="0"))
    cache_mb = int(get(opts, "--cache-mb", default="0"))
    threads = int(get(opts, "-t", "--threads", default="4"))
    k = int(get(opts, "--n-expert-used", default="2")) or 2
    csv_path = get(opts, "--csv")
    csv = open(csv_path, "w") if csv_path else None  # noqa: SIM115
    if csv:
        csv.write("# bmoe_metrics v2\n# engine=fake-0.1\n")
        csv.write(
            f"# model={os.path.basename(model)} arch=qwen3moe n_layer=4 n_expert=8 "
            f"n_expert_used={k} threads={threads} n_ctx=2048 n_ubatch=0 chatml=0\n"
        )
        csv.write(f"# moe_stream=1 cache_mb={cache_mb} io_threads=2 o_direct=1 overlap=0\n")
        csv.write(
            "step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,"
            "mgmt_ms,majflt,cpu_ms,dense_resident_frac,turn\n"
        )
        csv.flush()
    for flag in ("--route-trace", "--io-trace", "--compute-trace", "--compute-trace-layers"):
        if flag in opts:
            with open(opts[flag], "w") as fh:
                fh.write(f"# fake trace for {flag}\n")
    if mode == "crash-once":
        marker = os.path.join(get(opts, "--fake-state"), "crashed-once")
        if not os.path.exists(marker):
            open(marker, "w").close()
            mode = "crash"
        else:
            mode = "ok"
    base_wall = 4.0 / (1.0 + cache_mb / 8.0) + 0.5 * k
    jitter = float(get(opts, "--fake-jitter", default="0"))
    if jitter:
        import random

        base_wall *= 1.0 + jitter * random.random()

    def generate(n, turn, prompt, cancel_check=None):
        total = 0.0
        text = ""
        for step in range(1, n + 1):
            if delay:
                time.sleep(delay)
            if mode == "crash" and step == 3:
                os.kill(os.getpid(), signal.SIGSEGV)
            if mode == "hang" and step == 2:
                time.sleep(3600)
            wall = base_wall + 0.01 * (step % 3)
            total += wall
            data = {"step": step, "steps": n, "wall_ms": round(wall, 1), "io_ms": 1.0,
                    "compute_ms": round(wall - 1.0, 1), "mgmt_ms": 0.0, "stall_ms": 0.0,
                    "read_mb": 1.2, "cache_hit_pct": 10.0, "majflt": 0, "cpu_ms": 2.0,
                    "dense_resident_frac": -1.0, "delta_reasoning": ""}  # fmt: skip
            emit("LOAD", {"mb": 1.2, "ms": 1.0})
            if mode == "badutf8":
                emit("PROGRESS", data, raw_text=b"\xe4\xb8")
            else:
                data["delta_text"] = "x"
                emit("PROGRESS", data)
            text += "x"
            if csv:
                csv.write(
                    f"{step},{n},{wall:.3f},1.000,{wall - 1.0:.3f},1258291,10.00,0.000,"
                    f"0.000,0,2.000,-1.000,{turn}\n"
                )
                csv.flush()
            if cancel_check and cancel_check():
                return step, total, text, True
        return n, total, text, False

    def summary(n, total):
        if csv:
            tps = 1000.0 * n / total if total else 0.0
            csv.write(
                f"# summary tokens={n} tok/s={tps:.3f} n_prompt=5 load_s=0.010 "
                f"prefill_s=0.005 prefill_tps=1000.00\n"
            )
            csv.flush()

    if "--session" in opts:
        emit("READY", {"load_s": 0.01, "arch": "qwen3moe", "n_ctx": 2048,
                       "think_ctl": "template", "n_expert_used": k})  # fmt: skip
        turn = 0
        stdin = sys.stdin.buffer
        pending = []

        def cancel_check():
            ready, _, _ = select.select([stdin], [], [], 0)
            if ready:
                line = stdin.readline()
                if not line:
                    return True
                req = json.loads(line)
                if req.get("cmd") == "cancel":
                    return True
                pending.append(req)
            return False

        while True:
            if pending:
                req = pending.pop(0)
            else:
                line = stdin.readline()
                if not line:
                    break
                req = json.loads(line)
            cmd = req.get("cmd")
            if cmd == "close":
                break
            if cmd == "cancel":
                continue
            if cmd != "generate":
                emit("ERROR", {"id": req.get("id", -1), "fatal": False, "msg": f"bad {cmd}"})
                continue
            emit("BEGIN", {"id": req["id"]})
            if req["prompt"] == "FAIL":
                emit("ERROR", {"id": req["id"], "fatal": False, "msg": "prompt rejected"})
                continue
            n = int(req.get("n_predict", get(opts, "-n", "--n-predict", default="8")))
            done, total, text, cancelled = generate(n, turn, req["prompt"], cancel_check)
            summary(done, total)
            emit("DONE", {"id": req["id"], "cancelled": cancelled, "tokens": done,
                          "tok_s": round(1000.0 * done / total, 3) if total else 0.0,
                          "prefill_s": 0.005, "prefill_tps": 1000.0, "load_s": 0.01,
                          "cache_hit_pct": 10.0, "n_prompt": len(req["prompt"]),
                          "n_past": done, "text": text})  # fmt: skip
            turn += 1
        return 0

    n = int(get(opts, "-n", "--n-predict", default="128"))
    done, total, text, _ = generate(n, 0, get(opts, "-p", "--prompt", default=""))
    summary(done, total)
    out.write(b"=== answer ===\n" + text.encode() + b"\n=== perf ===\n")
    tps = 1000.0 * done / total if total else 0.0
    out.write(f"generation: {done} tokens, {total / done / 1000.0:.3f} s/token "
              f"({tps:.3f} tok/s)\n".encode())  # fmt: skip
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
