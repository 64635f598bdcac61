#!/usr/bin/env python3
"""Warp-stall samples of one kernel, summed per SASS block, from ncu's source page.

Reads the CSV of `ncu --import REPORT --page source --csv --print-source sass` (one row per SASS
instruction: its address, its text, the warp-state samples taken at it, how often it executed,
and one column per stall reason) and prints, for each straight-line block of the code (split
after every branch and exit, and at every branch target), its address range, instruction count,
share of all samples, warp-instructions executed, first instruction and top stall reasons;
then the kernel's totals per stall reason. Blocks under --min percent of the samples are left
out of the table (not of the totals). Where the report has ncu's SourceCounters columns of
shared-memory wavefronts, it ends with their sums per opcode (LDS, STS, LDSM, STSM, ...): which
instructions load the shared-memory (LSU) pipe, and how many wavefronts bank conflicts add.

  usage: scripts/stall_blocks.py SOURCE.csv [--min PERCENT]
"""
import argparse
import csv
import re
import sys


def number(text):
    text = (text or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def read_rows(path):
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    for i, row in enumerate(lines):  # ncu may print lines before the header
        if "Address" in row and "Source" in row:
            return row, lines[i + 1:]
    sys.exit(f"{path}: no header with Address and Source columns")


def pick(header, want, avoid=()):
    for i, name in enumerate(header):
        low = name.lower()
        if all(w in low for w in want) and not any(a in low for a in avoid):
            return i
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--min", type=float, default=0.3, help="least share of samples a block shown has (percent)")
    args = ap.parse_args()
    header, rows = read_rows(args.csv)
    at_addr, at_text = header.index("Address"), header.index("Source")
    at_samples = pick(header, ("sampling", "all"))
    at_executed = pick(header, ("instructions executed",), ("thread", "predicated"))
    # One column a reason over all samples; ncu repeats each as "(Not Issued)", left out here.
    reasons = [i for i, name in enumerate(header)
               if "stall" in name.lower() and i != at_samples and "sampling" not in name.lower()
               and "not issued" not in name.lower()]
    if at_samples is None:
        sys.exit(f"no 'Warp Stall Sampling (All Samples)' column among: {header}")

    code = []
    for row in rows:
        if len(row) <= max(at_addr, at_text):
            continue
        try:
            addr = int(row[at_addr], 16)
        except ValueError:
            continue
        code.append((addr, row[at_text].strip(), row))
    code.sort(key=lambda c: c[0])

    targets = set()
    for _, text, _ in code:
        m = re.search(r"\bBRA\b.*?0x([0-9a-fA-F]+)", text)
        if m:
            targets.add(int(m.group(1), 16))
    blocks, current = [], []
    for addr, text, row in code:
        if current and addr in targets:
            blocks.append(current)
            current = []
        current.append((addr, text, row))
        if re.search(r"\b(BRA|EXIT|RET|BRX|JMP)\b", text):
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)

    total = sum(number(r[at_samples]) for _, _, r in code) or 1.0
    short = lambda i: re.sub(r"^(smsp__pcsamp_warps_issue_)?stalled_|^stall_", "", header[i].lower()).split(" ")[0]
    print(f"{len(code)} instructions, {total:.0f} samples; blocks with at least {args.min}% of them:")
    for block in blocks:
        samples = sum(number(r[at_samples]) for _, _, r in block)
        if 100 * samples / total < args.min:
            continue
        executed = sum(number(r[at_executed]) for _, _, r in block) if at_executed is not None else 0
        per = sorted(((sum(number(r[i]) for _, _, r in block), i) for i in reasons), reverse=True)[:4]
        top = " ".join(f"{short(i)}:{100 * v / total:.1f}" for v, i in per if v > 0)
        first, last = block[0][0], block[-1][0]
        print(f"[{first:#07x}, {last:#07x}] {len(block):5d} instr {100 * samples / total:5.1f}%  "
              f"executed {executed:12.0f}  {block[0][1][:44]:44s} | {top}")
    sums = sorted(((sum(number(r[i]) for _, _, r in code), i) for i in reasons), reverse=True)
    print("whole kernel: " + " ".join(f"{short(i)}:{100 * v / total:.1f}" for v, i in sums if v > 0))
    shared_wavefronts(header, code, at_executed)


def shared_wavefronts(header, code, at_executed):
    at_all = pick(header, ("wavefronts shared",), ("ideal", "excessive"))
    at_ideal = pick(header, ("wavefronts shared", "ideal"))
    if at_all is None:
        return
    per = {}
    for _, text, row in code:
        wavefronts = number(row[at_all])
        if wavefronts == 0:
            continue
        op = re.sub(r"^@!?U?P\w+\s+", "", text).split(" ")[0]
        entry = per.setdefault(op, [0.0, 0.0, 0.0])
        entry[0] += wavefronts
        entry[1] += number(row[at_ideal]) if at_ideal is not None else wavefronts
        entry[2] += number(row[at_executed]) if at_executed is not None else 0
    total = sum(e[0] for e in per.values()) or 1.0
    print(f"shared-memory wavefronts: {total:.0f} (ideal {sum(e[1] for e in per.values()):.0f}); per opcode:")
    for op, (wavefronts, ideal, executed) in sorted(per.items(), key=lambda kv: -kv[1][0]):
        each = wavefronts / executed if executed else 0.0
        print(f"  {op:28s} {100 * wavefronts / total:5.1f}%  wavefronts {wavefronts:12.0f}  ideal {ideal:12.0f}  "
              f"executed {executed:11.0f}  per instruction {each:5.2f}")


if __name__ == "__main__":
    main()
