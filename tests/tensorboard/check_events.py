"""Check a run's TensorBoard event files against its metrics file(s), with
TensorBoard's own readers (tests/cli/tensorboard.sh; .venv-test).

  check_events.py TB_DIR FILES METRICS...

- every file of TB_DIR is an event file named as PyTorch's writer names them
  (events.out.tfevents.<10-digit seconds>.<this host>.<pid>.<n>), in creation
  order when sorted, whose records all pass TensorBoard's reader with both
  CRC-32C checks, and whose first event is file_version "brain.Event:2";
  FILES of them (a number, or "+2": at least 2);
- TensorBoard's EventAccumulator over the directory (all files, as
  TensorBoard loads a run) holds, for every training and eval record of the
  metrics files and every key of it but step and run_name, one scalar at that
  step with that name, equal to the record's value as a float32; and no other
  scalar;
- a text "run/start" per file, "num_model_parameters" and "config" per file;
- "elastic/events": the controller's event lines of the metrics files, in
  order, as text, all but the summary and any written after the last
  training record (no writer ran after them);
- a copy with one byte of a record changed fails the reader's CRC check.
Prints one line per check; exits 1 on the first failure.
"""
import glob
import json
import os
import re
import shutil
import socket
import struct
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow


def fail(msg):
    sys.exit(f"check_events: {msg}")


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def records(path):
    """Every record of an event file through TensorBoard's reader (CRCs checked)."""
    r = pywrap_tensorflow.PyRecordReader_New(path, 0, None, None)
    out = []
    while True:
        try:
            r.GetNext()
        except errors.OutOfRangeError:
            return out
        out.append(r.record())


def main():
    tb_dir, want_files, metrics = sys.argv[1], sys.argv[2], sys.argv[3:]
    recs, events = [], []
    for m in metrics:
        for line in open(m):
            r = json.loads(line)
            if "event" in r:
                events.append((len(recs), r))  # how many records came before it
            else:
                recs.append(r)
    files = sorted(glob.glob(os.path.join(tb_dir, "*")))
    if want_files.startswith("+") and len(files) < int(want_files[1:]) or \
            not want_files.startswith("+") and len(files) != int(want_files):
        fail(f"{len(files)} files in {tb_dir}, want {want_files}: {files}")
    host = socket.gethostname()
    name_re = re.compile(r"^events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)$")
    for f in files:
        m = name_re.match(os.path.basename(f))
        if not m or m.group(2) != host:
            fail(f"{os.path.basename(f)}: not events.out.tfevents.<seconds>.{host}.<pid>.<n>")
        recs_f = records(f)
        first = event_file_loader.EventFileLoader(f).Load().__next__()
        if first.file_version != "brain.Event:2" or first.wall_time < 1e9:
            fail(f"{f}: first event is not file_version brain.Event:2: {first}")
        print(f"  {os.path.basename(f)}: {len(recs_f)} records, CRCs good")

    acc = ea.EventAccumulator(tb_dir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    want = {}
    for r in recs:
        for k, v in r.items():
            if k in ("step", "run_name"):
                continue
            key = (k, r["step"])
            if key in want:
                fail(f"the metrics files hold {k} of step {r['step']} twice")
            want[key] = v
    got = {}
    for t in tags["scalars"]:
        for e in acc.Scalars(t):
            if (t, e.step) in got:
                fail(f"scalar {t} at step {e.step} twice")
            got[(t, e.step)] = e.value
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        fail(f"scalars missing {missing[:5]}, extra {extra[:5]}")
    bad = [(k, want[k], got[k]) for k in want if f32(want[k]) != got[k]]
    if bad:
        fail(f"{len(bad)} scalars differ from the metrics file, e.g. {bad[:3]}")
    names = sorted({t for t, _ in want})
    print(f"  {len(want)} scalars equal to the metrics file's values (float32): {', '.join(names)}")

    def texts(tag):
        if tag not in tags["tensors"]:
            return []
        return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
    for tag in ("run/start", "num_model_parameters", "config"):
        if len(texts(tag)) != len(files):
            fail(f"{len(texts(tag))} texts {tag}, want one per file ({len(files)}): {texts(tag)}")
    for step, t in texts("run/start"):
        print(f"  run/start at step {step}: {t}")
    last = len(recs)
    want_ev = [r for before, r in events if r["event"] != "summary" and before < last]
    got_ev = [json.loads(t.strip("`")) for _, t in texts("elastic/events")]
    if got_ev != want_ev:
        fail(f"elastic/events {[e['event'] for e in got_ev]}, want {[e['event'] for e in want_ev]}")
    steps_ok = all(s == e["step"] for (s, _), e in zip(texts("elastic/events"), got_ev))
    if not steps_ok:
        fail("elastic/events not at their events' steps")
    if events:
        print(f"  elastic/events: {' '.join(e['event'] for e in got_ev)} "
              f"(metrics file: {' '.join(r['event'] for _, r in events)})")

    # one byte of a record changed: the reader refuses it
    with tempfile.TemporaryDirectory() as d:
        bad_f = os.path.join(d, os.path.basename(files[0]))
        shutil.copy(files[0], bad_f)
        with open(bad_f, "r+b") as fh:
            fh.seek(40 + 20)  # inside the second record's data
            b = fh.read(1)
            fh.seek(40 + 20)
            fh.write(bytes([b[0] ^ 0x40]))
        try:
            records(bad_f)
        except errors.DataLossError as e:
            print(f"  a changed byte: {e}")
        else:
            fail("a changed byte passed the reader's CRC check")
    print("check_events: ok")


if __name__ == "__main__":
    main()
