/*
 * The job protocol of miniqueue, as SPIN checks it: claim, heartbeat, complete, fail (retry and
 * dead), hand back, park and resume, the reaper, the supervisor, cancel, requeue and expiry, with
 * leases that end while their holder still runs, workers that crash, a key with a concurrency
 * limit of 1 (whose jobs a claim may take together, to run one after another), a transactional
 * effect and a durable step. model/README.md says how to run it and what each invariant means.
 *
 * Every SQL statement is one atomic step (d_step): what the database gives each (row locks, and
 * the fence re-checked by the UPDATE that writes). What a worker does between two statements (a
 * handler running, a step's function) is a step of its own, so anything may happen in between.
 * The model has no clock: a running job's lease may expire, and the reaper recover it, at any
 * moment. A worker that stalls (SIGSTOP, swap) past its lease is a worker that takes no step
 * while that happens and another worker claims the job; it then resumes and sends its fenced
 * writes. Every such interleaving is in the search.
 *
 * Each action names the statements of tests/sql/store.sql it stands for in a comment
 * "sql: _name ..." above it; the statements that change no job's state in this protocol are in
 * the comment "outside" at the end of this file, each with why. tests/unit/test_protocol_model.py
 * checks that every statement of the snapshot is named exactly once in the two.
 */

/* Bounds: three bound sets, each searched exhaustively (the default, FAULTS and OPERATOR), and
 * a small one for the LTL property (LIVENESS); the budgets count over a whole run. Each action
 * but the heartbeat (which changes nothing here) moves something that never comes back (an
 * attempt, a job towards its end, a slot to idle, a waiting lease to a slot or away) or spends a
 * budget, so a run that does not renew forever ends, and the search with it. */
#define NS 4              /* handler slots: worker 0 runs two handler threads (slots 0 and 1),
                             workers 1 and 2 one each (slots 2 and 3) */
#define BUDGET 2          /* max_attempts the jobs are enqueued with (attempt_budget) */
#define LIMIT 1           /* max_concurrent of the key that jobs 0 and 1 name */
#if defined(FAULTS)
#define NJ 2              /* two jobs of the key */
#define CRASHES 1         /* worker processes that die (at most 1: see inc) */
#define HANDBACKS 1       /* uncharged hand-backs and parks */
#define CANCELS 1         /* an operator's cancels */
#define REQUEUES 0        /* an operator's requeues */
#define REMOVALS 1        /* jobs deleted, or expired, before they run */
#elif defined(OPERATOR)
#define NJ 2
#define CRASHES 0
#define HANDBACKS 0
#define CANCELS 1
#define REQUEUES 1
#define REMOVALS 0
#elif defined(LIVENESS)
#define NJ 2
#define CRASHES 0
#define HANDBACKS 1
#define CANCELS 0
#define REQUEUES 0
#define REMOVALS 0
#else
#define NJ 3              /* jobs 0 and 1 name the key, job 2 none */
#define CRASHES 0
#define HANDBACKS 0
#define CANCELS 0
#define REQUEUES 0
#define REMOVALS 0
#endif

#if NJ == 3
#define EACH_JOB(X) X(0) X(1) X(2)
#define ALL_JOBS(P) (P(0) && P(1) && P(2))
#else
#define EACH_JOB(X) X(0) X(1)
#define ALL_JOBS(P) (P(0) && P(1))
#endif

/* Job states (the state column). LOST, only in BROKEN_LOST: a row gone without a final state. */
#define AVAILABLE 0
#define RUNNING 1
#define WAITING 2
#define COMPLETED 3
#define FAILED 4
#define DEAD 5
#define CANCELLED 6
#define EXPIRED 7
#define LOST 8
#define FINAL(j) (state[j] >= COMPLETED && state[j] <= EXPIRED)
#define KEYED(j) ((j) < 2)

/* Where a handler slot is. */
#define IDLE 0            /* holds nothing */
#define BODY 1            /* its handler runs, its step not recorded: the step's function runs next */
#define END 2             /* its handler runs to its end: its outcome is sent next */

/* The database: a row per job. */
byte state[NJ];           /* AVAILABLE at enqueue */
byte att[NJ];             /* attempt: the run number and fencing token; it only grows */
byte maxatt[NJ];          /* max_attempts: raised by each uncharged hand-back */
byte holder[NJ];          /* leased_by: a worker incarnation's id; 0 for none */
byte steprec[NJ];         /* the step's record: 0 for none, else the attempt of the run that wrote it */

/* Ghosts: what the world saw, for the invariants. */
byte effects[NJ];         /* commits of the handler's transactional effect */
byte charged[NJ];         /* deaths charged since enqueue or the last requeue */

/* The workers. */
byte phase[NS];
byte sjob[NS];            /* the job a slot holds */
byte satt[NS];            /* the attempt it claimed */
bit inc[3];               /* each worker process's incarnation: a crash starts the next one */
byte wjob[3];             /* each worker process's waiting lease, taken together with the job it
                             runs: 1 + its job's index, 0 for none (held in the process, so a
                             crash forgets it) */
byte watt[3];             /* the attempt the waiting lease was taken at */
byte lane[NJ];            /* the lane of a running job's lease: the claim that took it, which no
                             other claim shares (NEW_LANE); 0 while the job is not running */

#define PROC(s) ((s) == 0 -> 0 : (s) - 1)
#define FIRST_SLOT(s) ((s) != 1)       /* the slot that stands for its worker's own loop */
#define WID(p) ((p) * 2 + inc[p] + 1)   /* host:pid:random: unique per incarnation */
#define SLOT_WID(s) WID(PROC(s))
/* A claim's lane: 1 + the index of the first job it took, plus 4 times the attempt it took that
 * job at (a job's attempt is taken once), so that the jobs one claim took together share it and
 * no two claims do. */
#define NEW_LANE(j) ((j) + 1 + 4 * att[j])

byte crashes = CRASHES;
byte handbacks = HANDBACKS;
byte cancels = CANCELS;
byte requeues = REQUEUES;
byte removals = REMOVALS;

/* The supervisor's work after it reaped a crashed worker: the dead worker's id, and the job whose
 * handler ran when it died (1 + its index) if exactly one did. */
byte sup_wid;
byte sup_culprit;

/* The invariants, each asserted under its own name, which pan prints when one is violated. */
hidden byte fenced_write_by_holder;
hidden byte one_effect_per_job;
hidden byte limit_held_by_lanes;
hidden byte recorded_step_never_reruns;
hidden byte no_job_lost;
hidden byte dead_exactly_at_max_attempts;
hidden byte scratch_runs;
hidden byte scratch_culprit;

/* The fence of every worker-side statement: id AND attempt AND state = 'running' AND leased_by. */
#define HELD(j, w, a) (state[j] == RUNNING && holder[j] == (w) && att[j] == (a))
#define SLOT_HELD(s) HELD(sjob[s], SLOT_WID(s), satt[s])
#define WAITING_HELD(p) HELD(wjob[p] - 1, WID(p), watt[p])

#ifdef BROKEN_FENCE
/* Broken: the completion's fence omits the attempt. */
#define COMPLETE_FENCE(s) (state[sjob[s]] == RUNNING && holder[sjob[s]] == SLOT_WID(s))
#else
#define COMPLETE_FENCE(s) SLOT_HELD(s)
#endif

#ifdef BROKEN_STEP
/* Broken: a step's record finds its job's row by id alone. */
#define STEP_FENCE(s) true
#else
#define STEP_FENCE(s) SLOT_HELD(s)
#endif

/* The key's leases, its jobs running (at the attempt that took them): the claim's room is the
 * limit less the leases (what the database counts), which under-admits when a lane holds several
 * leases. */
#define KEY_LEASES ((state[0] == RUNNING) + (state[1] == RUNNING))
#ifdef BROKEN_LIMIT
/* Broken: the claim ignores the key's limit. */
#define CLAIMABLE(j) (state[j] == AVAILABLE)
#else
#define CLAIMABLE(j) (state[j] == AVAILABLE && (!KEYED(j) || KEY_LEASES < LIMIT))
#endif

/* The key's lanes: the distinct lanes of its leases. The leases one claim took together are one
 * lane, held from the claim until the last of them ends. */
#define KEY_LANES (KEY_LEASES - (state[0] == RUNNING && state[1] == RUNNING && lane[0] == lane[1]))

/* The key's handlers running: those that hold their lease (STRICT_LIMIT: all of them, a handler
 * whose lease ended while it ran included). */
#define HANDLING(s) (phase[s] != IDLE && KEYED(sjob[s]))
#ifdef STRICT_LIMIT
#define KEY_HANDLER(s) HANDLING(s)
#else
#define KEY_HANDLER(s) (HANDLING(s) && SLOT_HELD(s))
#endif
#define KEY_HANDLERS (KEY_HANDLER(0) + KEY_HANDLER(1) + KEY_HANDLER(2) + KEY_HANDLER(3))

/* A job taken together starts on an idle slot only when no other handler of its worker runs a job
 * of the key (one taken together with it, or one whose lease ended while it ran: the worker frees
 * the lane when the handler returns). Broken: whenever a slot of the worker is idle. Workers 1
 * and 2 have one slot each, so only worker 0's two slots can tell. */
#ifdef BROKEN_TOGETHER
#define LANE_FREE(s) true
#else
#define LANE_FREE(s) ((s) > 1 || !HANDLING(1 - (s)))
#endif

/* A step's function may run unless a run of an earlier attempt recorded it (STRICT_STEPS: unless
 * any run did, a later one included, so that a stale run may not finish the function either). */
#ifdef STRICT_STEPS
#define STEP_MAY_RUN(s) (steprec[sjob[s]] == 0)
#else
#define STEP_MAY_RUN(s) (steprec[sjob[s]] == 0 || steprec[sjob[s]] >= satt[s])
#endif

/* A fenced write that matched its row: its writer holds that lease. */
inline landed(s) {
    fenced_write_by_holder = SLOT_HELD(s);
    assert(fenced_write_by_holder)
}

/* The same, for a worker's waiting lease. */
inline landed_waiting(p) {
    fenced_write_by_holder = WAITING_HELD(p);
    assert(fenced_write_by_holder)
}

/* Asserted by each action that leases, starts or gives back a job of the key. */
inline limit_held() {
    limit_held_by_lanes = (KEY_LANES <= LIMIT && KEY_HANDLERS <= LIMIT);
    assert(limit_held_by_lanes)
}

/* What a trail replay (spin -t) prints of each action. */
#define FORMAT(...) #__VA_ARGS__
#define SAY(what, s) printf(FORMAT(what: slot %d (worker id %d), job %d, attempt %d\n), s, SLOT_WID(s), sjob[s], satt[s])
#define LOST_LEASE(what, s) printf(FORMAT(what: slot %d (worker id %d), job %d, attempt %d: no row matched (LeaseLost)\n), \
        s, SLOT_WID(s), sjob[s], satt[s])
#define SAY_WAITING(what, p) printf(FORMAT(what: worker %d (worker id %d), job %d taken together, attempt %d\n), \
        p, WID(p), wjob[p] - 1, watt[p])
#define LOST_WAITING(what, p) printf(FORMAT(what: worker %d (worker id %d), job %d taken together, attempt %d: \
        no row matched (LeaseLost)\n), p, WID(p), wjob[p] - 1, watt[p])

inline forget(s) {
    phase[s] = IDLE; sjob[s] = 0; satt[s] = 0
}

inline forget_waiting(p) {
    wjob[p] = 0; watt[p] = 0
}

/* A lease ends: the job leaves running (its lane with it). */
inline unlease(j) {
    holder[j] = 0; lane[j] = 0
}

/* A death nobody asked for, charged: retried (after the backoff), or dead at max_attempts. */
inline charge(j) {
    charged[j]++;
    unlease(j);
    if
    :: att[j] >= maxatt[j] ->
        state[j] = DEAD;
        dead_exactly_at_max_attempts = (charged[j] == BUDGET)
    :: else ->
        state[j] = AVAILABLE;
        dead_exactly_at_max_attempts = (charged[j] < BUDGET)
    fi;
    assert(dead_exactly_at_max_attempts)
}

/* Back without spending an attempt: the run number stays spent, and max_attempts moves with it
 * (broken: it does not). */
inline hand_back(j) {
    state[j] = AVAILABLE;
#ifndef BROKEN_DEAD
    maxatt[j]++;
#endif
    unlease(j)
}

/* A lease taken by slot s's worker. */
inline lease(s, j) {
    state[j] = RUNNING; att[j]++; holder[j] = SLOT_WID(s)
}

/* A handler starts on slot s for job j at attempt a, reading the steps recorded so far. */
inline start(s, j, a) {
    sjob[s] = j; satt[s] = a;
    if
    :: steprec[j] == 0 -> phase[s] = BODY
    :: else -> phase[s] = END
    fi
}

/* The claim, and the start of its handler, at once: a worker starts a prefetched job only before
 * its start-by time, which its clock sets short of the lease (miniqueue/worker/slots.py), and
 * hands it back otherwise (hand_back), so no handler starts for a lease that expired. Its first
 * statement reads the steps recorded so far, under the lease just taken. */
inline claim(s, j) {
    lease(s, j); lane[j] = NEW_LANE(j);
    start(s, j, att[j]);
    SAY(claim, s);
    limit_held()
}

/* The claim that takes both jobs of the key together, in the one lane the key has room for: job j
 * starts at once (as in claim), job k waits in the worker, its lease held in the same lane. */
inline claim_together(s, j, k) {
    lease(s, j); lane[j] = NEW_LANE(j);
    lease(s, k); lane[k] = lane[j];
    start(s, j, att[j]);
    wjob[PROC(s)] = k + 1; watt[PROC(s)] = att[k];
    SAY(claim_together, s); SAY_WAITING(waits, PROC(s));
    limit_held()
}

#define CLAIM(j) :: d_step { phase[s] == IDLE && CLAIMABLE(j) -> claim(s, j) }

/* Only worker 0 takes jobs together: it is the one with two handler threads, where a job taken
 * together can meet another handler of its worker, and a one-thread worker that takes them is
 * worker 0 with its other slot idle. Workers 1 and 2 taking them too would multiply the states
 * (OPERATOR: 16.4 million instead of 6.9, the default 5.3 instead of 2.9) past what the suite can
 * search in its time. */
#define TOGETHER_BY(s) (PROC(s) == 0)
#define CLAIM_TOGETHER(j, k) :: d_step { phase[s] == IDLE && TOGETHER_BY(s) && wjob[PROC(s)] == 0 && \
        CLAIMABLE(j) && CLAIMABLE(k) -> claim_together(s, j, k) }

proctype Slot(byte s) {
end_slot:
    do
    /* action claim -- sql: _claim_one _claim_many _claim_one_down _claim_many_down _steps
     * Any available job (the claim's order is not modelled); a job of the key only while the key
     * has room. The claim statement also completes the batch its worker sends along (fenced as
     * _complete is): that is the action complete followed at once by this one. The same statements
     * may take the key's jobs together instead: claim_together. */
    EACH_JOB(CLAIM)

    /* action claim_together -- the same statements as claim: when the key has room for exactly one
     * more, the claim may lease several of its available jobs to one worker, to run one after
     * another. Either job may be the one that starts (the claim's order is not modelled). */
    CLAIM_TOGETHER(0, 1)
    CLAIM_TOGETHER(1, 0)

    /* action start_together -- no statement: an idle slot starts its worker's waiting job once no
     * other handler of the worker runs a job of the key, if its lease still holds (before its
     * start-by time, as every prefetched job; its steps read under that lease, which no other run
     * can write under); a lease that ended meanwhile (the reaper, a cancel) is dropped. */
    :: d_step { phase[s] == IDLE && wjob[PROC(s)] != 0 && LANE_FREE(s) ->
        if
        :: WAITING_HELD(PROC(s)) -> start(s, wjob[PROC(s)] - 1, watt[PROC(s)]); SAY(start_together, s)
        :: else -> LOST_WAITING(start_together, PROC(s))
        fi;
        forget_waiting(PROC(s));
        limit_held() }

    /* action hand_back_together -- the statement of hand_back (a prefetched job that did not
     * start): the waiting job's start-by time passed, and its worker hands it back uncharged.
     * Sent by the worker, not a handler: by its first slot. */
    :: d_step { FIRST_SLOT(s) && wjob[PROC(s)] != 0 && handbacks > 0 ->
        if
        :: WAITING_HELD(PROC(s)) ->
            SAY_WAITING(hand_back_together, PROC(s)); landed_waiting(PROC(s));
            handbacks--; hand_back(wjob[PROC(s)] - 1)
        :: else -> LOST_WAITING(hand_back_together, PROC(s))
        fi;
        forget_waiting(PROC(s));
        limit_held() }

    /* action renew -- sql: _renew
     * The heartbeat. With no clock in the model, a renewal changes nothing but must be fenced;
     * a lost lease asks the handler to stop, which it may not notice at once. (LIVENESS assumes
     * handlers end: it leaves out this step, which could repeat forever.) */
#ifndef LIVENESS
    :: d_step { phase[s] != IDLE ->
        if
        :: SLOT_HELD(s) -> landed(s)
        :: else -> LOST_LEASE(renew, s)
        fi }
    /* The waiting lease is renewed too (by the worker's first slot): a lost one waits for
     * start_together or hand_back_together to drop it. */
    :: d_step { FIRST_SLOT(s) && wjob[PROC(s)] != 0 ->
        if
        :: WAITING_HELD(PROC(s)) -> landed_waiting(PROC(s))
        :: else -> LOST_WAITING(renew, PROC(s))
        fi }
#endif

    /* action step -- sql: _record_step
     * The step's function runs, then its record is sent, fenced. */
    :: d_step { phase[s] == BODY ->
        SAY(step_function_runs, s);
        recorded_step_never_reruns = STEP_MAY_RUN(s);
        assert(recorded_step_never_reruns);
        if
        :: STEP_FENCE(s) ->
#ifndef BROKEN_STEP
            landed(s);
#endif
            SAY(record_step, s);
            if
            :: steprec[sjob[s]] == 0 -> steprec[sjob[s]] = satt[s]
            :: else -> skip
            fi
        :: else -> LOST_LEASE(record_step, s)
        fi;
        phase[s] = END }

    /* action complete -- sql: _complete
     * job.transaction(): the handler's writes and its fenced completion commit together, or
     * neither does (broken: the writes commit on their own first). A completion may also ride
     * in the worker's next claim (see claim). */
    :: d_step { phase[s] == END ->
#ifdef BROKEN_EFFECT
        printf("effect committed on its own: job %d\n", sjob[s]);
        effects[sjob[s]]++;
#endif
        if
        :: COMPLETE_FENCE(s) ->
            SAY(complete, s);
            landed(s);
#ifndef BROKEN_EFFECT
            effects[sjob[s]]++;
#endif
            state[sjob[s]] = COMPLETED; unlease(sjob[s])
        :: else -> LOST_LEASE(complete, s)
        fi;
        one_effect_per_job = (effects[sjob[s]] <= 1);
        assert(one_effect_per_job);
        forget(s) }

    /* action record_failure -- sql: _record_failures
     * The handler raised: retried after its backoff, or dead at max_attempts. */
    :: d_step { phase[s] == END ->
        if
        :: SLOT_HELD(s) -> SAY(record_failure, s); landed(s); charge(sjob[s])
        :: else -> LOST_LEASE(record_failure, s)
        fi;
        forget(s) }

    /* action fail -- sql: _fail
     * The handler said never retry. */
    :: d_step { phase[s] == END ->
        if
        :: SLOT_HELD(s) -> SAY(fail, s); landed(s); state[sjob[s]] = FAILED; unlease(sjob[s])
        :: else -> LOST_LEASE(fail, s)
        fi;
        forget(s) }

    /* action hand_back -- sql: _snooze _rate_limit _sleep _release
     * Back without spending an attempt: a snooze, back-pressure, a durable sleep, or a run that a
     * stop someone asked for interrupted (or a prefetched job that did not start). */
    :: d_step { phase[s] == END && handbacks > 0 ->
        if
        :: SLOT_HELD(s) -> SAY(hand_back, s); landed(s); handbacks--; hand_back(sjob[s])
        :: else -> LOST_LEASE(hand_back, s)
        fi;
        forget(s) }

    /* action park -- sql: _wait _lock_keys
     * Wait for a signal: the job waits outside the claim, its lease given up, no attempt spent. */
    :: d_step { phase[s] == END && handbacks > 0 ->
        if
        :: SLOT_HELD(s) -> SAY(park, s); landed(s); handbacks--; hand_back(sjob[s]); state[sjob[s]] = WAITING
        :: else -> LOST_LEASE(park, s)
        fi;
        forget(s) }
    od
}

/* A slot of a worker that died: what ran there is lost. */
inline crash_slot(s) {
    if
    :: phase[s] != IDLE -> scratch_runs++; scratch_culprit = sjob[s] + 1
    :: else -> skip
    fi;
    forget(s)
}

/* A worker process that died: what ran on its slots is lost, and its waiting lease with it, a
 * running job under the dead worker's id until the supervisor or the reaper returns it. No
 * handler ran it, so the supervisor hands it back uncharged, unless the one handler that ran was
 * a run of the same job whose lease had ended: the supervisor knows the job a handler ran, not its
 * attempt, and charges that job's lease. */
inline crash(p) {
    printf("crash: worker %d (id %d)\n", p, WID(p));
    crashes--; scratch_runs = 0; scratch_culprit = 0;
    if
    :: p == 0 -> crash_slot(0); crash_slot(1)
    :: else -> crash_slot(p + 1)
    fi;
    forget_waiting(p);
    sup_wid = WID(p); sup_culprit = (scratch_runs == 1 -> scratch_culprit : 0); inc[p] = 1
}

/* What the supervisor does with each lease that _leases_of names, by a write fenced with the
 * dead worker's id and the attempt read: the job of the one handler that ran is charged
 * (_record_failures), the others (a waiting lease taken together included) go back uncharged
 * (_release). */
inline sup_return(j) {
    if
    :: HELD(j, sup_wid, att[j]) && sup_culprit == j + 1 ->
        printf("supervise: job %d charged (attempt %d)\n", j, att[j]); charge(j)
    :: HELD(j, sup_wid, att[j]) && sup_culprit != j + 1 ->
        printf("supervise: job %d handed back (attempt %d)\n", j, att[j]); hand_back(j)
    :: else -> skip
    fi
}

/* The reaper's recovery of an expired lease (broken: it deletes the job; or it hands the job
 * back uncharged). */
inline recover(j) {
    printf("recover: job %d, attempt %d, lease of worker id %d expired\n", j, att[j], holder[j]);
#if defined(BROKEN_LOST)
    state[j] = LOST; unlease(j)
#elif defined(BROKEN_CHARGE)
    charged[j]++;
    hand_back(j);
    dead_exactly_at_max_attempts = (charged[j] < BUDGET);
    assert(dead_exactly_at_max_attempts)
#else
    charge(j)
#endif
}

#define RECOVER(j) :: d_step { state[j] == RUNNING -> recover(j) }
#define SUPERVISE(j) sup_return(j);
#define CANCEL(j) :: d_step { cancels > 0 && (state[j] == AVAILABLE || state[j] == RUNNING || state[j] == WAITING) -> \
        printf("cancel: job %d\n", j); cancels--; state[j] = CANCELLED; unlease(j) }
#define REQUEUE(j) :: d_step { requeues > 0 && state[j] >= FAILED && state[j] <= EXPIRED -> \
        printf("requeue: job %d\n", j); requeues--; state[j] = AVAILABLE; maxatt[j] = att[j] + BUDGET; charged[j] = 0 }
#define EXPIRE(j) :: d_step { removals > 0 && (state[j] == AVAILABLE || state[j] == WAITING) -> \
        printf("expire: job %d\n", j); removals--; state[j] = EXPIRED }
#define RESUME(j) :: d_step { state[j] == WAITING -> printf("resume: job %d\n", j); state[j] = AVAILABLE }

/* The database's clock and the reaper, the supervisor, and the operator. */
proctype World() {
end_world:
    do
    /* action recover -- sql: _recover
     * The lease expired (its holder died, stalled, or lost its connection) and the reaper, whose
     * statement re-checks the expiry, recovers the job and charges the attempt. */
    EACH_JOB(RECOVER)

    /* action crash -- no statement: a worker process dies and loses all it held. */
    :: d_step { crashes > 0 && sup_wid == 0 -> crash(0) }
    :: d_step { crashes > 0 && sup_wid == 0 -> crash(1) }
    :: d_step { crashes > 0 && sup_wid == 0 -> crash(2) }

    /* action supervise -- sql: _leases_of
     * The supervisor reaped the dead worker (waitpid) and returns its leases. */
    :: d_step { sup_wid != 0 -> EACH_JOB(SUPERVISE) sup_wid = 0; sup_culprit = 0 }

    /* action cancel -- sql: _cancel */
    EACH_JOB(CANCEL)

    /* action requeue -- sql: _requeue
     * A fresh budget of attempts; the attempt keeps counting, the recorded steps stay. */
    EACH_JOB(REQUEUE)

    /* action expire -- sql: _expire _delete
     * A job ends before it runs: its deadline passed, or an operator deleted it (deleting a
     * finished job changes nothing here; a running one cannot be deleted). */
    EACH_JOB(EXPIRE)

    /* action resume -- sql: _signal _time_out_waits
     * A signal for a parked job, or its timeout: available at once. */
    EACH_JOB(RESUME)

    /* Nothing else can happen: every job has ended (LIVENESS: the world idles on, a fair cycle
     * that the LTL property judges). */
#ifdef LIVENESS
    :: timeout -> skip
#else
    :: timeout -> no_job_lost = ALL_JOBS(FINAL); assert(no_job_lost)
#endif
    od
}

/* action enqueue -- sql: _enqueue _enqueue_limited _enqueue_many _enqueue_many_limited
 *                       _enqueue_keyed _enqueue_replacing _enqueue_many_keyed _copy_due
 *                       _copy_scheduled _copy_due_traced _copy_scheduled_traced _copy_keyed
 *                       _copy_keyed_due
 * The jobs, available, before anything runs. */
#define ENQUEUE(j) maxatt[j] = BUDGET;
init {
    d_step { EACH_JOB(ENQUEUE) skip };
    atomic { run World(); run Slot(0); run Slot(1); run Slot(2); run Slot(3) }
}

#ifdef LIVENESS
/* Every job ends in a final state and stays there (pan -a -f: under weak fairness). */
ltl no_job_lost { <> [] ALL_JOBS(FINAL) }
#endif

/* outside -- the statements that change no job's state in this protocol, or change only what
 * the model leaves out (dependencies, sequences, unique keys, rates and queue caps, schedules,
 * progress, retention of finished jobs, the schema), each with why:
 *   _enqueue_waiting            enqueues a job that waits for parents or its sequence: dependencies are left out
 *   _enqueue_waiting_limited    the same, with limits
 *   _lock_parents               locks the parents' rows, to read their states
 *   _link_dependent             notes a dependent on its parents' rows: dependencies are left out
 *   _by_key                     reads which job holds an idempotency key
 *   _holder                     reads which job holds a unique key
 *   _drop_key                   forgets an idempotency key: no job's state
 *   _lock_window                locks a unique key's window: no job's state
 *   _open_window                opens a unique key's window: no job's state
 *   _draw_ids                   draws job ids from the sequence
 *   _notify_queues              NOTIFY only
 *   _lock_callbacks             locks the callbacks' rows, to read their states
 *   _dependents_of_held         reads (and locks) a held job's dependents, fenced: writes nothing
 *   _join_group                 adds a parent to waiting callbacks: dependencies are left out
 *   _record_progress            writes the progress column alone, fenced as _renew is
 *   _progress                   reads a job's progress
 *   _kept                       reads the signals kept for no job yet
 *   _drop_windows               drops ended unique-key windows: no job's state
 *   _drop_idle_sequences        drops idle sequences: no job's state
 *   _drop_ended_pauses          drops ended pauses of keys: no job's state
 *   _recount                    recounts the finished counts
 *   _trim_minutes               trims the per-minute counts
 *   _prune                      deletes finished jobs: their state is final already
 *   _prune_defaults             the same, from the default partition
 *   _jobs_churn                 reads table statistics
 *   _vacuum_jobs                VACUUM of the jobs table
 *   _analyze_jobs               ANALYZE of the jobs table
 *   _states                     reads jobs' states
 *   _get                        reads a job
 *   _result                     reads a job's result
 *   _await                      asks for a notification when a job ends: no job's state
 *   _list                       lists jobs
 *   _count_matching             counts jobs
 *   _ids_matching               lists jobs' ids
 *   _queue_stats                reads counts per queue
 *   _parent_results             reads the parents' results
 *   _limit_waits                reads the jobs waiting on each limit
 *   _throughput                 reads the per-minute counts
 *   _periodic_state             reads the periodic schedules' state
 *   _claim_slot                 claims a periodic slot, before its job is enqueued
 *   _set_periodic_enabled       enables or disables a periodic schedule
 *   _publish_tasks              publishes the tasks' declarations
 *   _serve_queues               notes the queues served
 *   _task_declarations          reads the tasks' declarations
 *   _unserved_queues            reads which queues no worker serves
 *   _unrun_tasks                reads which queues' next job no live worker runs
 *   _set_paused                 pauses a queue: claims take nothing from it meanwhile, no job changes
 *   _paused                     reads the paused queues
 *   _set_queue_limit            caps a queue's running jobs: only a key's limit is modelled
 *   _rank                       gives fair jobs just enqueued their turns (and a rule's limit scope): no job's state
 *   _fair_queues                reads the fair queues
 *   _set_fair                   makes a queue fair: no job's state
 *   _unranked                   reads a queue's jobs without a turn
 *   _set_rule                   stores a key rule: no job's state
 *   _remove_rule                removes a key rule: no job's state
 *   _apply_rules                re-ranks waiting fair jobs and sets their rule's limit scope: no job's state
 *   _rules                      reads the key rules
 *   _shares                     reads what each fair key holds
 *   _why_keys_ahead             reads the fair keys ahead of a job
 *   _queue_limits               reads the queues' caps
 *   _known_queues               reads which queues exist
 *   _known_queue_names          reads the queues' names
 *   _schedules                  reads the schedules
 *   _schedule                   reads a schedule
 *   _create_schedule            creates a schedule
 *   _lock_schedule              locks a schedule
 *   _change_schedule            changes a schedule
 *   _delete_schedule            deletes a schedule
 *   _claim_stored_slot          claims a stored schedule's slot, before its job is enqueued
 *   _upsert_processes           records the live processes
 *   _delete_processes           forgets a supervisor's processes
 *   _processes                  reads the live processes
 *   _schema_version             reads the schema's version
 *   _workers_from               reads the oldest version workers may run
 *   _versions_table             names the versions table
 *   _migration_ddl              creates the versions table
 *   _applied_versions           reads the migrations applied
 *   _pin_search_path            sets the search path
 *   _pin_session_search_path    sets the search path
 *   _record_version             records a migration
 *   _horizon                    reads what holds the MVCC horizon back
 *   _table_health               reads table statistics
 *   _backlog                    reads the backlog an autoscaler acts on
 *   _desired_workers            reads how many workers would drain it in time
 *   _aging_queues               reads the queues whose jobs age, with their top priorities
 *   _age_jobs                   raises the priority of waiting jobs: the claim's order is not modelled
 *   _set_queue_aging            sets a queue's aging interval: no job's state
 *   _queue_aging                reads the queues' aging intervals
 *   _release_sequence           lets a blocked sequence go on: sequences are left out
 *   _blocked_sequences          reads the blocked sequences
 *   _sequence                   reads a sequence
 *   _missing                    reads which history partitions are missing
 *   _forget_expired             forgets history partitions past retention: finished jobs only
 *   _unkey                      forgets the idempotency keys of finished jobs
 *   _record                     records a history partition
 *   _expired                    reads the history partitions past retention
 *   _uncount                    takes dropped partitions off the counts
 *   _partitions                 reads the history partitions
 *   _move_legacy                moves finished jobs from the legacy table to the history
 *   _legacy_age                 reads the legacy table's oldest job
 *   _drop_legacy                drops the emptied legacy table
 *   _shard                      reads this database's shard
 *   _old_ids                    reads whether ids below a shard's base exist
 *   _next_id                    reads the next job id
 *   _join                       records this database's shard
 *   _why_job                    reads why a job waits
 *   _why_workers                reads the live workers, for why
 *   _why_limits                 reads the limits a job waits on, for why
 *   _why_parents                reads a job's unfinished parents, for why
 *   _why_sequence               reads a job's sequence, for why
 *   _why_ahead                  counts the jobs ahead of one, for why
 */
