# The dK/dV/dQ kernel's barrier model (session 74, a helper): adapted from session 73's v75 model (git history).
# v75 (turn barriers 4 + c) removed; v74 (dQ warpgroup) kept; partial wgmma waits (keep) and
# per-warp register hazards (checked statically) added; consumers built in mode main or v78.
"""Executable synchronization model of src/cuda/hopper/bwd_kernel.cuh: main (which has v74's dQ
warpgroup, not v75's turn barriers 4 + c) in cfg.mode 'main', and main + v78 (the query stage
released once dV and dK are done, before the dQ turn) in cfg.mode 'v78'.  Adapted from
session 73's v75-barrier-model.py (in git history).

Every role is compiled to a straight-line op list (the kernel's control flow depends only on the
configuration).  Line numbers: see build().

Granularity W: W=1 models each warpgroup as one process (arrivals of 128 threads at once);
W=4 models every warp of a warpgroup as its own process (arrivals of 32 threads, named barriers
counted in warps, wgmma collective over the warpgroup's 4 warps).

mbarrier: init count, pending arrivals, tx count, completed-phase count ph.
  try_wait.parity(P) returns true iff (ph & 1) != P   (ptx.cuh:121 mbarrier_wait, the PTX
  semantics: the phase of parity P has completed, i.e. the current phase's parity differs).
named barrier (bar.sync/bar.arrive id, 256 or 128 threads): a phase completes when `threads`
  arrivals (sync or arrive) accumulated; sync blocks its warp until that phase completes.
"""
import random
import sys

KS = 2  # kBwdStages
MUT = set()  # mutations, for validating that the model catches bugs


class Cfg:
    def __init__(s, kC, dqg, dkreg, kvs, Q, K, items, W, mode='main'):
        s.kC, s.dqg, s.dkreg, s.KVS, s.Q, s.K, s.items, s.W = kC, dqg, dkreg, kvs, Q, K, items, W
        s.mode = mode

    def __repr__(s):
        return (f"mode={s.mode} kC={s.kC} dqgroup={int(s.dqg)} dk_from_regs={int(s.dkreg)} kv_stages={s.KVS} "
                f"q_tiles={s.Q} k_blocks={s.K} items={s.items} W={s.W}")


# ---------------------------------------------------------------- op-list construction
# Line numbers: L(main, v78) -> the line in src/cuda/hopper/bwd_kernel.cuh of main, or of main with
# docs/perf/prepared/v78-bwd-stage-released-before-the-dq-turn.patch applied (the two trees are
# identical up to line 499, so a single number is given there).
def build(cfg):
    kC, W, Q, K, KVS = cfg.kC, cfg.W, cfg.Q, cfg.K, cfg.KVS
    mode = cfg.mode
    assert mode in ('main', 'v78')
    v78 = mode == 'v78'
    wcnt = 128 // W            # threads one process arrives with
    procs = []                 # (name, wg, w, ops)
    # mbarriers (lines 184-195)
    mb_init = {}
    for s in range(KS):
        mb_init[('full', s)] = 1 + 32
        mb_init[('empty', s)] = kC * 128
    for s in range(2):
        mb_init[('kv_full', s)] = 1 + 32
        mb_init[('kv_empty', s)] = (kC + (1 if cfg.dqg and 'kv_empty_v73_count' not in MUT else 0)) * 128
        mb_init[('ds_full', s)] = kC * 128
        mb_init[('ds_empty', s)] = 128
    # named barriers on main: only 1 + c (dS^T buffer rows of the warpgroup, !kDkFromRegisters)
    nb_ids = sorted([1 + c for c in range(kC)] if not cfg.dkreg else [])

    # ---- producer warp (lines 198-277)
    P = []
    kv_it = 0
    it0 = 0
    for item in range(cfg.items):
        for kb in range(K):
            def load_step(qt):
                it = it0 + kb * Q + qt
                s = it % KS
                if it >= KS and 'no_empty_wait' not in MUT:
                    P.append(('mwait', ('empty', s), (it // KS - 1) & 1, it // KS - 1, 218))
                P.append(('mexpect', ('full', s), 220))
                P.append(('tma', ('full', s), ('stage', s), it, 221))      # Q, dO, tile boxes 221-226
                P.append(('gwrite', ('stats', s), it, 240))                # statistics, flag 229-246
                P.append(('marrive', ('full', s), 32, 247))
            early = (Q if Q < KS else KS) if KVS == 1 else 0              # line 251
            for qt in range(early):
                load_step(qt)                                             # line 252
            kvs = kv_it & (KVS - 1)
            if kv_it >= KVS:
                P.append(('mwait', ('kv_empty', kvs), ((kv_it >> (KVS - 1)) - 1) & 1, (kv_it >> (KVS - 1)) - 1, 254))
            P.append(('mexpect', ('kv_full', kvs), 256))
            P.append(('tma', ('kv_full', kvs), ('kv', kvs), kv_it, 259))  # K, V 257-261
            P.append(('gwrite', ('kvmeta', kvs), kv_it, 265))             # out offsets, key biases 263-272
            P.append(('marrive', ('kv_full', kvs), 32, 273))
            for qt in range(early, Q):
                load_step(qt)                                             # line 274
            kv_it += 1
        it0 += K * Q
    P.append(('done', 277))
    procs.append(('P', 'P', 0, P))

    # dq_step (lines 303-366), the same in both trees
    def dq_step(ops, wg, w, it, kb, qt, kvs, kvit, item, batches, regs):
        buf = it & 1
        ops.append(('mwait', ('ds_full', buf), (it >> 1) & 1, it >> 1, 314))
        if kb > 0:
            ops.append(('gread', ('dq', qt, w), item * K + kb - 1, 320))
        ops.append(('rwrite', 'dqacc', 322))
        reads = tuple([(('ds', buf, c2, w2), it) for c2 in range(kC) for w2 in range(W)] + [(('kv', kvs), kvit)])
        ops.append(('wg_issue', len(batches), 329))
        batches.append(reads)
        regs.append((frozenset(), frozenset({'dqacc'})))
        ops.append(('wg_wait', 0, 330))
        ops.append(('marrive', ('ds_empty', buf), wcnt, 332))
        ops.append(('rread', 'dqacc', 333))
        if kb + 1 == K:
            ops.append(('gread', ('kvmeta', kvs), kvit, 335))
        else:
            ops.append(('gwrite', ('dq', qt, w), item * K + kb, 342))

    wg_batches = {}
    wg_regs = {}
    # ---- dQ warpgroup (lines 368-384)
    if cfg.dqg:
        for w in range(W):
            ops = []
            b = []
            r = []
            kv_it = 0
            it0 = 0
            for item in range(cfg.items):
                for kb in range(K):
                    kvs = kv_it & (KVS - 1)
                    ops.append(('mwait', ('kv_full', kvs), (kv_it >> (KVS - 1)) & 1, kv_it >> (KVS - 1), 376))
                    for qt in range(Q):
                        dq_step(ops, 'D', w, it0 + kb * Q + qt, kb, qt, kvs, kv_it, item, b, r)   # 377
                    ops.append(('marrive', ('kv_empty', kvs), wcnt, 379))
                    kv_it += 1
                it0 += K * Q
            ops.append(('done', 382))
            procs.append((f'D.w{w}', 'D', w, ops))
        wg_batches['D'] = b
        wg_regs['D'] = r

    # ---- consumers (main lines 386-526, v78 lines 386-532)
    L = (lambda m, n: n) if v78 else (lambda m, n: m)
    for c in range(kC):
        for w in range(W):
            ops = []
            b = []
            r = []
            kv_it = 0
            it0 = 0
            for item in range(cfg.items):
                for kb in range(K):
                    kvs = kv_it & (KVS - 1)
                    ops.append(('mwait', ('kv_full', kvs), (kv_it >> (KVS - 1)) & 1, kv_it >> (KVS - 1), 417))
                    ops.append(('gread', ('kvmeta', kvs), kv_it, 418))          # key biases
                    ops.append(('rwrite', 'dkv', 420))                          # dk_acc, dv_acc = 0

                    def issue_s_dp(it, line):                                   # lines 424-435
                        s = it % KS
                        ops.append(('mwait', ('full', s), (it // KS) & 1, it // KS, 426))
                        ops.append(('wg_issue', len(b), line))                  # 428-434
                        b.append(((('stage', s), it), (('kv', kvs), kv_it)))
                        r.append((frozenset(), frozenset({'sacc'})))
                    issue_s_dp(it0 + kb * Q, 439)
                    ops.append(('wg_wait', 0, 440))
                    for qt in range(Q):
                        it = it0 + kb * Q + qt
                        s = it % KS
                        ops.append(('gread', ('stats', s), it, 450))            # statistics (and 459-465)
                        ops.append(('gread', ('stage', s), it, 454))            # tile box (ldmatrix)
                        ops.append(('rread', 'sacc', 459))                      # softmax in place
                        ops.append(('rwrite', 'sacc', 459))
                        buf = it & 1
                        if it >= 2:
                            ops.append(('mwait', ('ds_empty', buf), ((it >> 1) - (0 if 'ds_empty_parity' in MUT else 1)) & 1, (it >> 1) - 1, 472))
                        ops.append(('rread', 'sacc', 476))                      # pack P^T, dS^T
                        ops.append(('rwrite', 'pa', 476))
                        ops.append(('gwrite', ('ds', buf, c, w), it, 479))      # stmatrix
                        if not cfg.dkreg:
                            ops.append(('nbsync', 1 + c, 128, 485))
                        ops.append(('marrive', ('ds_full', buf), wcnt, 486))

                        def issue_dvdk():                                       # lines 489-499
                            reads = [(('stage', s), it)]
                            if not cfg.dkreg:
                                reads += [(('ds', buf, c, w2), it) for w2 in range(W)]
                            ops.append(('wg_issue', len(b), 499))
                            b.append(tuple(reads))
                            r.append((frozenset({'pa'}), frozenset({'dkv'})))
                        turn = not cfg.dqg and it % kC == c
                        if not v78:
                            issue_dvdk()
                            if qt + 1 < Q:
                                issue_s_dp(it + 1, 500)
                            ops.append(('wg_wait', 0, 504))
                            ops.append(('marrive', ('empty', s), wcnt, 510))
                            if turn:
                                dq_step(ops, c, w, it, kb, qt, kvs, kv_it, item, b, r)   # 513
                        else:
                            if qt + 1 < Q:
                                if 'v78_issue_first' in MUT:
                                    issue_s_dp(it + 1, 504)
                                    issue_dvdk()
                                else:
                                    issue_dvdk()
                                    issue_s_dp(it + 1, 504)
                                if 'v78_no_wait' not in MUT:
                                    ops.append(('wg_wait', 2 if 'v78_keep2' in MUT else 1, 505))
                            else:
                                issue_dvdk()
                                ops.append(('wg_wait', 1 if 'v78_last_keep1' in MUT else 0, 507))
                            rel = (it + 1) % KS if 'v78_next_stage' in MUT else s
                            ops.append(('marrive', ('empty', rel), wcnt, 512))
                            if turn:
                                dq_step(ops, c, w, it, kb, qt, kvs, kv_it, item, b, r)   # 515
                            if 'v78_no_trailing_wait' not in MUT:
                                ops.append(('wg_wait', 0, 517))
                    ops.append(('gread', ('kvmeta', kvs), kv_it, L(516, 522)))  # out offsets
                    ops.append(('marrive', ('kv_empty', kvs), wcnt, L(519, 525)))
                    ops.append(('rread', 'dkv', L(522, 528)))                   # epilogue stores
                    kv_it += 1
                it0 += K * Q
            ops.append(('done', L(526, 532)))
            procs.append((f'C{c}.w{w}', c, w, ops))
        wg_batches[c] = b
        wg_regs[c] = r
    return procs, mb_init, nb_ids, wg_batches, wg_regs


# ---------------------------------------------------------------- the machine
class Machine:
    """Mutable state; snapshot()/restore() for exhaustive search."""

    def __init__(self, cfg):
        self.cfg = cfg
        procs, mb_init, nb_ids, wg_batches, wg_regs = build(cfg)
        self.violations = {}
        self.trace = []
        self.names = [p[0] for p in procs]
        self.wgof = [p[1] for p in procs]
        self.n = len(procs)
        self.wg_batches = wg_batches
        self.wg_regs = wg_regs
        self.wg_members = {}
        for i, g in enumerate(self.wgof):
            if g != 'P':
                self.wg_members.setdefault(g, []).append(i)
        # Register accesses (rread/rwrite) depend only on the warp's own program order (its own
        # issued and waited wgmma groups), so they are checked here, statically, and stripped.
        # ('wg_wait', keep, line): wgmma.wait_group keep -- all but the last `keep` groups that this
        # warp committed are complete (groups complete in order).
        self.ops = []
        for i, (name, g, w, ops) in enumerate(procs):
            iss = wt = 0
            kept = []
            for op in ops:
                if op[0] == 'wg_issue':
                    iss += 1
                elif op[0] == 'wg_wait':
                    wt = max(wt, iss - op[1])
                elif op[0] in ('rread', 'rwrite'):
                    for k in range(wt, iss):
                        rd, wr = self.wg_regs[g][k]
                        if op[1] in wr or (op[0] == 'rwrite' and op[1] in rd):
                            self.viol('register accessed while a wgmma group in flight uses it', op[-1],
                                      f'{name} {op[0]} {op[1]} while group {k} (reads {set(rd)}, writes {set(wr)}) may run')
                    continue
                kept.append(op)
            self.ops.append(kept)
        # prefix counts: issued before pc, and batches completed-known (waited) before pc
        self.issued_before = []
        self.waited_before = []
        for ops in self.ops:
            ib, wb = [0], [0]
            iss = 0
            wt = 0
            for op in ops:
                if op[0] == 'wg_issue':
                    iss += 1
                if op[0] == 'wg_wait':
                    wt = max(wt, iss - op[1])
                ib.append(iss)
                wb.append(wt)
            self.issued_before.append(ib)
            self.waited_before.append(wb)
        self.mb_names = sorted(mb_init)
        self.mb_idx = {k: i for i, k in enumerate(self.mb_names)}
        self.mb_init = [mb_init[k] for k in self.mb_names]
        self.nb_ids = nb_ids
        self.nb_idx = {k: i for i, k in enumerate(nb_ids)}
        self.nb_thr = {}
        # buffers
        bufs = set()
        for ops in self.ops:
            for op in ops:
                if op[0] in ('gwrite', 'gread'):
                    bufs.add(op[1])
                if op[0] == 'tma':
                    bufs.add(op[2])
        for g, bl in wg_batches.items():
            for reads in bl:
                for bname, _ in reads:
                    bufs.add(bname)
        self.buf_names = sorted(bufs, key=repr)
        self.buf_idx = {k: i for i, k in enumerate(self.buf_names)}
        self.reset()

    def reset(self):
        self.pc = [0] * self.n
        self.reg = [None] * self.n            # named-barrier phase a sync waits for
        self.mb = [[c, 0, 0] for c in self.mb_init]   # pending, tx, completed phases
        self.mb_arr = [frozenset() for _ in self.mb_init]  # (proc, kind) arrived this phase
        self.nb = [[0, 0, ()] for _ in self.nb_ids]   # arrived threads, completed phases, arrivals
        self.tma = []                          # pending (mb index, buffer index)
        self.ver = [None] * len(self.buf_names)
        self.trace = []

    def snapshot(self):
        return (tuple(self.pc), tuple(self.reg), tuple(tuple(m) for m in self.mb), tuple(self.mb_arr),
                tuple((a, b, c) for a, b, c in self.nb), tuple(sorted(self.tma)), tuple(self.ver))

    def restore(self, st):
        pc, reg, mb, mba, nb, tma, ver = st
        self.pc = list(pc)
        self.reg = list(reg)
        self.mb = [list(m) for m in mb]
        self.mb_arr = list(mba)
        self.nb = [list(x) for x in nb]
        self.tma = list(tma)
        self.ver = list(ver)

    # ------------------------------------------------------------ checks
    def viol(self, kind, line, detail):
        key = (kind, line)
        if key not in self.violations:
            self.violations[key] = (detail, list(self.trace[-40:]))

    def active_reads(self, bidx):
        """(wg, batch) of wgmma batches reading buffer bidx that are in flight."""
        out = []
        bname = self.buf_names[bidx]
        for g, mem in self.wg_members.items():
            mx = max(self.issued_before[i][self.pc[i]] for i in mem)
            mn = min(self.waited_before[i][self.pc[i]] for i in mem)
            for k in range(mn, mx):
                for rb, _ in self.wg_batches[g][k]:
                    if rb == bname:
                        out.append((g, k))
        return out

    def tma_pending_on(self, bidx):
        return any(b == bidx for _, b in self.tma)

    # ------------------------------------------------------------ mbarrier
    def mb_arrive(self, i, m, cnt, kind, line):
        st = self.mb[m]
        tag = (self.wgof[i] if self.cfg.W == 1 else self.names[i], kind)
        if tag in self.mb_arr[m]:
            self.viol('mbarrier double arrival in one phase', line,
                      f'{self.names[i]} arrives twice on {self.mb_names[m]} phase {st[2]}')
        self.mb_arr[m] = self.mb_arr[m] | {tag}
        if cnt > st[0]:
            self.viol('mbarrier arrivals exceed phase count', line,
                      f'{self.names[i]} arrives {cnt} on {self.mb_names[m]} with {st[0]} pending')
            rest = cnt - st[0]
            st[0] = 0
            self.mb_maybe_complete(m)
            st[0] -= rest
            return
        st[0] -= cnt
        self.mb_maybe_complete(m)

    def mb_maybe_complete(self, m):
        st = self.mb[m]
        if st[0] == 0 and st[1] == 0:
            st[2] += 1
            st[0] = self.mb_init[m]
            self.mb_arr[m] = frozenset()

    # ------------------------------------------------------------ enabledness
    def enabled(self, i):
        ops = self.ops[i]
        op = ops[self.pc[i]]
        k = op[0]
        if k == 'done':
            return False
        if k == 'mwait':
            m = self.mb_idx[op[1]]
            return (self.mb[m][2] & 1) != op[2]
        if k == 'nbwait':
            return self.nb[self.nb_idx[op[1]]][1] >= self.reg[i]
        if k == 'wg_wait':
            if self.reg[i] is not None:   # a pending nbsync wait is encoded in reg
                pass
            if not getattr(self.cfg, 'collective', True):
                return True
            # the groups this wait completes must have been issued by every warp of the warpgroup
            # (wgmma is collective); with keep = 0 this is `mine`, the warp's own issued count
            target = self.waited_before[i][self.pc[i] + 1]
            return all(self.issued_before[j][self.pc[j]] >= target for j in self.wg_members[self.wgof[i]])
        if k == 'nbsync' and self.reg[i] is not None:
            return self.nb[self.nb_idx[op[1]]][1] >= self.reg[i]
        return True

    def actions(self):
        acts = [('p', i) for i in range(self.n) if self.enabled(i)]
        seen = set()
        for t in self.tma:
            if t not in seen:
                seen.add(t)
                acts.append(('t', t))
        return acts

    def all_done(self):
        return all(self.ops[i][self.pc[i]][0] == 'done' for i in range(self.n)) and not self.tma

    # ------------------------------------------------------------ step
    def step(self, act):
        if act[0] == 't':
            m, b = act[1]
            self.tma.remove(act[1])
            self.trace.append(f'TMA lands {self.buf_names[b]} on {self.mb_names[m]}')
            self.mb[m][1] -= 1
            self.mb_maybe_complete(m)
            return
        i = act[1]
        op = self.ops[i][self.pc[i]]
        k = op[0]
        line = op[-1]
        self.trace.append(f'{self.names[i]} L{line} {k} {op[1:-1]}')
        if k == 'mwait':
            m = self.mb_idx[op[1]]
            ph = self.mb[m][2]
            intended = op[3]
            if ph != intended + 1:
                self.viol('mbarrier wait satisfied by wrong phase', line,
                          f'{self.names[i]} waits {op[1]} phase {intended} (parity {op[2]}) but {ph} phases completed')
            self.pc[i] += 1
        elif k == 'marrive':
            self.mb_arrive(i, self.mb_idx[op[1]], op[2], 'arrive', line)
            self.pc[i] += 1
        elif k == 'mexpect':
            m = self.mb_idx[op[1]]
            self.mb[m][1] += 1
            self.mb_arrive(i, m, 1, 'expect', line)
            self.pc[i] += 1
        elif k == 'tma':
            m = self.mb_idx[op[1]]
            b = self.buf_idx[op[2]]
            ar = self.active_reads(b)
            if ar or self.tma_pending_on(b):
                self.viol('buffer overwritten while read', line,
                          f'TMA into {op[2]} (version {op[3]}) while wgmma batches {ar} read it')
            self.ver[b] = op[3]
            self.tma.append((m, b))
            self.pc[i] += 1
        elif k == 'gwrite':
            b = self.buf_idx[op[1]]
            ar = self.active_reads(b)
            if ar:
                self.viol('buffer overwritten while read', line,
                          f'{self.names[i]} writes {op[1]} (version {op[2]}) while wgmma batches {ar} read it')
            self.ver[b] = op[2]
            self.pc[i] += 1
        elif k == 'gread':
            b = self.buf_idx[op[1]]
            if self.ver[b] != op[2] or self.tma_pending_on(b):
                self.viol('stale/in-flight buffer read', line,
                          f'{self.names[i]} reads {op[1]} expecting version {op[2]}, has {self.ver[b]}'
                          f'{" (TMA in flight)" if self.tma_pending_on(b) else ""}')
            self.pc[i] += 1
        elif k == 'wg_issue':
            g = self.wgof[i]
            mine = self.issued_before[i][self.pc[i]]
            for bname, v in self.wg_batches[g][op[1]]:
                b = self.buf_idx[bname]
                if self.ver[b] != v or self.tma_pending_on(b):
                    self.viol('stale/in-flight buffer read', line,
                              f'{self.names[i]} wgmma reads {bname} expecting version {v}, has {self.ver[b]}'
                              f'{" (TMA in flight)" if self.tma_pending_on(b) else ""}')
            self.pc[i] += 1
        elif k == 'wg_wait':
            self.pc[i] += 1
        elif k == 'nbarrive' or (k == 'nbsync' and self.reg[i] is None):
            n = self.nb_idx[op[1]]
            thr = op[2]
            st = self.nb[n]
            who = self.names[i]
            if who in st[2]:
                self.viol('named barrier: one warp twice in a phase', line,
                          f'{who} arrives again on bar {op[1]} phase {st[1]} ({st[2]})')
            st[0] += 128 // self.cfg.W
            st[2] = st[2] + (who,)
            target = st[1] + 1
            if st[0] > thr:
                self.viol('named barrier overrun', line, f'bar {op[1]} has {st[0]} > {thr}')
            if st[0] >= thr:
                self.check_nb_phase(op[1], st[2], line)
                st[0] -= thr
                st[1] += 1
                st[2] = ()
            if k == 'nbsync':
                if st[1] >= target:
                    self.pc[i] += 1
                else:
                    self.reg[i] = target
            else:
                self.pc[i] += 1
        elif k == 'nbsync':   # wake-up of a blocked sync
            self.reg[i] = None
            self.pc[i] += 1
        else:
            raise RuntimeError(op)

    def check_nb_phase(self, bid, who, line):
        kC = self.cfg.kC
        wgs = [self.wgof[self.names.index(w)] for w in who]
        assert 1 <= bid <= kC   # main: only the dS^T rows barrier 1 + c of warpgroup c
        want = [bid - 1] * self.cfg.W
        if sorted(wgs) != want:
            self.viol('named barrier phase made of wrong roles', line, f'bar {bid} phase by {who}')

    def exit_checks(self):
        for n, bid in enumerate(self.nb_ids):
            if self.nb[n][0] != 0:
                self.viol('named barrier phase incomplete at exit', 0,
                          f'bar {bid}: {self.nb[n][0]} threads arrived ({self.nb[n][2]})')
        res = {}
        for bid, n in self.nb_idx.items():
            res[bid] = self.nb[n][1]
        return res


# ---------------------------------------------------------------- explorers
def random_run(cfg, rng, mode, max_steps=10 ** 7):
    M = Machine(cfg)
    # PCT-like priorities
    pri = {}
    change = set()
    if mode == 'pct':
        keys = [('p', i) for i in range(M.n)] + ['t']
        for k in keys:
            pri[k] = rng.random()
        total = sum(len(o) for o in M.ops) * 2
        change = set(rng.randrange(total) for _ in range(6))
    steps = 0
    while True:
        acts = M.actions()
        if not acts:
            break
        if mode == 'pct':
            a = max(acts, key=lambda a: pri[a if a[0] == 'p' else 't'] + (rng.random() * 1e-6))
            if steps in change:
                kk = a if a[0] == 'p' else 't'
                pri[kk] = rng.random() * 0.01
        else:
            a = acts[rng.randrange(len(acts))]
        M.step(a)
        steps += 1
    if not M.all_done():
        stuck = [f'{M.names[i]} at L{M.ops[i][M.pc[i]][-1]} {M.ops[i][M.pc[i]][:-1]}'
                 for i in range(M.n) if M.ops[i][M.pc[i]][0] != 'done']
        M.viol('DEADLOCK', 0, 'blocked: ' + '; '.join(stuck) +
               f' | mbarriers {dict(zip(M.mb_names, M.mb))} | named {dict(zip(M.nb_ids, M.nb))}')
    else:
        M.exit_checks()
    return M, steps


def exhaustive(cfg, limit=3_000_000):
    """DFS over all interleavings with a visited set (stateful search)."""
    M = Machine(cfg)
    start = M.snapshot()
    seen = {start}
    stack = [(start, None)]
    # iterative DFS with explicit path for traces
    path = []
    terminal = 0
    deadlocks = 0
    work = [(start, 0)]
    parents = {}
    while work:
        st, depth = work.pop()
        M.restore(st)
        M.trace = []
        acts = M.actions()
        if not acts:
            if not M.all_done():
                deadlocks += 1
                # rebuild trace
                tr = []
                s = st
                while s in parents:
                    s, a = parents[s]
                    tr.append(a)
                tr.reverse()
                stuck = [f'{M.names[i]} at L{M.ops[i][M.pc[i]][-1]} {M.ops[i][M.pc[i]][:-1]}'
                         for i in range(M.n) if M.ops[i][M.pc[i]][0] != 'done']
                M.viol('DEADLOCK', 0, 'blocked: ' + '; '.join(stuck) + f' trace(actions)={tr[-30:]}')
            else:
                terminal += 1
                M.exit_checks()
            continue
        for a in acts:
            M.restore(st)
            M.step(a)
            ns = M.snapshot()
            if ns not in seen:
                seen.add(ns)
                parents[ns] = (st, a)
                work.append((ns, depth + 1))
                if len(seen) > limit:
                    return M, len(seen), terminal, deadlocks, False
    return M, len(seen), terminal, deadlocks, True


def exhaustive2(cfg, limit=20_000_000):
    """Stateful DFS over all interleavings; visited set holds 64-bit hashes of full states; the DFS
    stack is the trace of any deadlock found."""
    M = Machine(cfg)
    start = M.snapshot()
    seen = {hash(start)}
    stack = [(start, M.actions(), 0)]
    path = []
    terminal = deadlocks = 0
    while stack:
        st, acts, k = stack[-1]
        if k == 0 and not acts:
            M.restore(st)
            if not M.all_done():
                deadlocks += 1
                stuck = [f'{M.names[i]} at L{M.ops[i][M.pc[i]][-1]} {M.ops[i][M.pc[i]][:-1]}'
                         for i in range(M.n) if M.ops[i][M.pc[i]][0] != 'done']
                M.viol('DEADLOCK', 0, 'blocked: ' + '; '.join(stuck) + f' path(last 40)={path[-40:]}')
            else:
                terminal += 1
                M.exit_checks()
        if k >= len(acts):
            stack.pop()
            if path:
                path.pop()
            continue
        stack[-1] = (st, acts, k + 1)
        M.restore(st)
        a = acts[k]
        M.step(a)
        ns = M.snapshot()
        h = hash(ns)
        if h in seen:
            continue
        seen.add(h)
        if len(seen) > limit:
            return M, len(seen), terminal, deadlocks, False
        path.append((M.names[a[1]] if a[0] == 'p' else 'TMA', M.trace[-1] if M.trace else ''))
        M.trace = M.trace[-40:]
        stack.append((ns, M.actions(), 0))
    return M, len(seen), terminal, deadlocks, True
