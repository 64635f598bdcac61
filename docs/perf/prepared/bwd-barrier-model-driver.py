"""Driver for bwd-barrier-model.py: exhaustive W=1, randomized W=4, seeded bugs.  Usage:
  python3 bwd-barrier-model-driver.py exh SECONDS LIMIT      # both modes, grid below, deadline for starting tasks
  python3 bwd-barrier-model-driver.py rand SECONDS           # random W=4 schedules, both modes alternately
  python3 bwd-barrier-model-driver.py bugs SECONDS           # seeded bugs in mode v78 (each must be caught)
"""
import importlib.util, itertools, json, multiprocessing as mp, os, random, sys, time

_spec = importlib.util.spec_from_file_location(
    "bwd_barrier_model", os.path.join(os.path.dirname(os.path.abspath(__file__)), "bwd-barrier-model.py"))
m = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(m)

STRUCT = [(2, False), (2, True), (3, False)]        # (kC, dqg): dQ warpgroup only with kC == 2


def grid(Qs, Ks, items):
    out = []
    for (kC, dqg), dkreg, kvs, Q, K, it in itertools.product(STRUCT, (False, True), (1, 2), Qs, Ks, items):
        out.append((kC, dqg, dkreg, kvs, Q, K, it))
    return out


def summarize(M):
    return {f'{k[0]} @L{k[1]}': v[0][:300] for k, v in M.violations.items()}


def exh_task(a):
    mode, args, limit, mut = a
    m.MUT.clear(); m.MUT.update(mut)
    t = time.time()
    M, n, term, dl, full = m.exhaustive2(m.Cfg(*args, 1, mode), limit)
    return mode, args, n, term, dl, full, summarize(M), time.time() - t


def rand_task(a):
    mode, seed, mut, W = a[:4]
    if len(a) > 4 and time.time() > a[4]:        # past the deadline: skip (the pool prefetches tasks)
        return mode, None, seed, 0, None
    m.MUT.clear(); m.MUT.update(mut)
    rng = random.Random(seed)
    kC, dqg = rng.choice(STRUCT)
    args = (kC, dqg, rng.random() < 0.5, rng.choice((1, 2)), rng.randint(1, 5), rng.randint(1, 3), rng.randint(1, 2))
    M, steps = m.random_run(m.Cfg(*args, W, mode), rng, 'pct' if seed % 2 else 'uniform')
    return mode, args, seed, steps, summarize(M)


def main():
    what, secs = sys.argv[1], float(sys.argv[2])
    pool = mp.Pool(2)
    t0 = time.time()
    if what == 'exh':
        limit = int(sys.argv[3])
        cfgs = grid((1, 2, 3, 4), (1, 2, 3), (1, 2))
        cfgs.sort(key=lambda a: (a[4] * a[5] * a[6] * (a[0] + a[1]), a))
        tasks = [(mode, a, limit, ()) for a in cfgs for mode in ('main', 'v78')]
        res = {'main': [], 'v78': []}
        it = iter(tasks)
        pending = []
        skipped = 0
        def feed():
            nonlocal skipped
            for t in it:
                if time.time() - t0 > secs:
                    skipped += 1
                    continue
                pending.append(pool.apply_async(exh_task, (t,)))
                return True
            return False
        for _ in range(4):
            feed()
        while pending:
            r = pending.pop(0).get()
            res[r[0]].append(r)
            if r[6] or r[4]:
                print('FINDING', r, flush=True)
            feed()
        for mode in ('main', 'v78'):
            rs = res[mode]
            print(f'[{mode}] configs {len(rs)}, complete {sum(r[5] for r in rs)}, truncated at limit '
                  f'{sum(not r[5] for r in rs)}, states {sum(r[2] for r in rs)}, deadlocks {sum(r[4] for r in rs)}, '
                  f'with violations {sum(bool(r[6]) for r in rs)}, cpu {sum(r[7] for r in rs):.0f}s')
            trunc = [r[1] for r in rs if not r[5]]
            if trunc:
                print(f'  truncated: {trunc}')
            big = sorted(rs, key=lambda r: -r[2])[:3]
            print('  largest:', [(r[1], r[2]) for r in big])
        print('tasks skipped by deadline:', skipped, 'wall', round(time.time() - t0), flush=True)
    elif what == 'rand':
        cnt = {'main': 0, 'v78': 0}
        bad = {'main': {}, 'v78': {}}
        steps = {'main': 0, 'v78': 0}
        seed = 0
        def gen():
            nonlocal seed
            while time.time() - t0 < secs:
                seed += 1
                yield ('main' if seed % 4 < 2 else 'v78', seed, (), 4, t0 + secs)
        for mode, args, sd, st, v in pool.imap_unordered(rand_task, gen(), chunksize=8):
            if args is None:
                continue
            cnt[mode] += 1
            steps[mode] += st
            for k, d in v.items():
                if k not in bad[mode]:
                    bad[mode][k] = (args, sd, d)
                    print('FINDING', mode, k, args, sd, d, flush=True)
        for mode in cnt:
            print(f'[{mode}] W=4 schedules {cnt[mode]}, steps {steps[mode]}, distinct findings {len(bad[mode])}')
        print('wall', round(time.time() - t0), flush=True)
    elif what == 'bugs':
        bugs = ['v78_keep2', 'v78_no_wait', 'v78_next_stage', 'v78_issue_first', 'v78_last_keep1',
                'v78_no_trailing_wait']
        small = [(2, False, False, 1, 3, 1, 1), (2, False, True, 2, 2, 2, 1), (2, True, True, 2, 3, 1, 1),
                 (3, False, False, 1, 3, 2, 1), (2, False, False, 2, 1, 2, 2)]
        for bug in bugs:
            found = {}
            for args in small:
                r = exh_task(('v78', args, 300_000, (bug,)))
                for k in r[6]:
                    found.setdefault('W1 ' + k, args)
                if r[4]:
                    found.setdefault('W1 DEADLOCK', args)
            # a few W=4 random schedules
            n = 0
            for mode, args, sd, st, v in pool.imap_unordered(rand_task, [('v78', s, (bug,), 4) for s in range(1, 201)]):
                n += 1
                for k in v:
                    found.setdefault('W4 ' + k, args)
            print(f'{bug}: caught={bool(found)}')
            for k, a in sorted(found.items()):
                print(f'   {k}  first config {a}')
            print(flush=True)
        print('wall', round(time.time() - t0))


if __name__ == '__main__':
    main()
