"""Adaptive DSD against the per-segment oracle: the link's RTT steps and the prompts' acceptance
changes during a run of requests; each policy picks every request's mode (cloud AR, sync or
pipelined DSD; co-located with --modes) and every round's gamma and mode.

    python benchmarks/adaptive.py --launcher sim [--seeds 3]
    flock /tmp/dsd-netns.lock python benchmarks/adaptive.py --launcher netns --seeds 1 --first-seed K   (root;
        about 9 minutes a seed: one seed per command, so a command stays under the quiet lock's ~12 minutes)
    python benchmarks/adaptive.py --launcher sim|netns --rtt-trace experiments/traces/roaming-de.csv

A replayed RTT trace (``--rtt-trace``: t_s, rtt_ms from t_s 0, netem/schedule.py's trace format)
replaces the two-level alternation: the link follows the trace from every run's start (netns: the
trace's first RTT is the points' link and its later rows the schedule's steps, in the experiment
file's schedule_order), the prompts alternate as before, and the oracle is measured at each of
the trace's RTT levels with each alpha, held still, exactly as for the alternation (so a trace
should have few levels: experiments/traces/roaming-de.csv, from benchmarks/roaming_trace.py, has
three, RIPE Atlas country-pair means). The printed keys are the same; ``--plot`` draws the RTT the
runs saw and every policy's chosen gamma and mode over time.

Scenario (defaults): hardware profile paper-cap-td1 (edge draft 1 ms, t_verify = t_ar = 20 ms);
the RTT alternates 10 / 150 ms every --segment-s seconds of the run; the prompts alternate between
two classes every --alpha-requests requests, drafted with alpha 0.9 and 0.3 (synthetic backend,
``alpha_classes``: the prompt's first token says its class). So four conditions, each several
requests long; near + high alpha wants pipelined DSD, far or low alpha wants cloud AR, and the
best gamma moves with the RTT.

Every policy and every static (mode, gamma) of the grid runs the same requests in the same order
under the same schedules. The per-segment oracle is measured, not predicted: the best static
choice's per-token time in each condition, each static arm run with the link held at that
condition's RTT on the run's own prompts of that class (every arm on the same prompts, so the
prompts' acceptance luck -- the synthetic draft matches by position -- is common to all arms).
sim: every arm on every prompt, the best in-sample (virtual time: no timing noise to be chosen
on). netns (``--oracle constant``, the default; benchmarks/adaptive_oracle.py ``constant_oracle``):
every arm first on 2 prompts of each class at each RTT (the pilot), then only the arms within
1.25x of the pilot's best there on the rest of the class's prompts; per condition the best of
those chosen on every other prompt and scored on the others, and vice versa, the two averaged
(out of sample: the choice does not see the timing noise it is scored on); the in-sample figure
is printed beside it. Before (session 8b, ``--oracle schedule``) the netns oracle was estimated
from the static runs under the schedule (every piece of every request, a straddling one's tokens
shared out by time times rate, split by request): the arms there run different prompts in each
condition than the policies do, so one seed's unlucky prompts moved its oracle by 27% (seed 0's
(10 ms, 0.9) 7.76 ms/token against seed 1's 6.09); both estimates are still printed, and the sim
prints both netns estimators beside its own oracle as a check. A request that spent
t_i seconds in condition i could at best have emitted sum_i t_i / best_i tokens; ``X_vs_oracle_pct``
is how many more tokens the oracle would have emitted in X's time, over the whole run, averaged
over seeds (i.e. per-token latency above the oracle).

Beside it (not judged): the policies against the prompt-matched oracle (benchmarks/adaptive_oracle.py
``prompt_matched_oracle``: each request set beside the oracle's time on that very prompt, so the
prompts' acceptance luck, which the class-average oracle leaves in, is common to both), mean +- SE
and per seed.

Prints last: model_vs_oracle_pct= bandit_vs_oracle_pct= heuristic_vs_oracle_pct=
best_static_vs_oracle_pct= switches_per_100_rounds= (plan changes of the model policy per 100
rounds, request-level mode changes included) and goals_met=.

Measured 2026-12-01 (the sim is virtual time, so load does not move it; netns times are real):
  before the mid-request hand-over (dsd/driver.py):
  sim, 3 seeds:   model 10.7, bandit 20.4, heuristic 52.0, best static 58.6 (pipelined 8), switches 2.0
  netns, 2 seeds: model 28.2, bandit 72.9, heuristic 73.2, best static 58.6, switches 4.4 (load 5-10)
  with it (a round may hand the request to cloud AR and back; the alpha estimate's change test):
  sim, 3 seeds:   model 6.1, bandit 20.6, heuristic 52.0, best static 58.6 (pipelined 8), switches 2.5
  netns, 1 seed:  model 16.1, bandit 44.1, heuristic 49.5, best static 52.6 (pipelined 8), switches 3.0
                  (load average 2.5 at the start, 1.8 at the end; 5 minutes)
  session 8 (every hand-over segment measures the link; server requests always in a session; the
  sim's Open pipelined and its link FIFO; the model's GLR change test, RTT steps and finite-request
  factor; the bandit's in-request exploration, arm sharing and context hysteresis):
  sim, 3 seeds:   model 3.8, bandit 11.9, heuristic 47.6, best static 57.4 (pipelined 8), switches 3.0
                  (per seed: model 2.5 / 4.6 / 4.4, bandit 9.3 / 14.7 / 11.6)
  netns, 2 seeds: model 8.7 (5.6 / 11.8), bandit 19.8 (20.5 / 19.1), heuristic 48.1, best static 49.5
                  (pipelined 8), switches 3.4; the quiet lock held exclusively, 9 minutes, load
                  average 1.35 before, 0.28 / 0.47 / 0.96 after
  netns, 1 seed:  model 4.8, bandit 12.3, heuristic 47.7, best static 53.6 (pipelined 4), switches 3.2
                  (the same way, 5 minutes earlier; load 1.4 before, 0.25 / 0.97 / 1.53 after;
                  seed 0 again in the 2-seed run: model 5.6, bandit 20.5 -- netns runs of one
                  seed differ by this much, and its oracle is a minimum over few requests)
  session 8b (the bandit: a kind worth its best arm shrunk toward the kind's pooled rate by one
  observation; an untried DSD borrows the optimistic rate of a dominating context. The netns
  oracle: every piece, split choice; before, the minimum over whole-segment requests):
  sim, 3 seeds:   model 3.8 (2.5 / 4.6 / 4.4), bandit 10.1 (8.3 / 11.7 / 10.2), heuristic 47.6,
                  best static 57.4 (pipelined 8), switches 3.0 (virtual time; 4 minutes)
                  the netns oracle's estimator on the sim's statics under the schedule, against the
                  constant-condition oracle (ms/token, per seed): (10, 0.9) 6.10 / 6.15 / 5.47 vs
                  5.90 / 6.01 / 5.61; (150, 0.9) 24.53 / 22.31 / 23.07 vs 23.13 (near-equal arms
                  there: AR, pipelined 16); (x, 0.3) within 0.3%. Scored with it the policies read
                  model 0.4 / 3.9 / 5.4 (mean 3.2), bandit 6.0 / 10.8 / 11.4 (mean 9.4): within
                  ~0.7 points of the true oracle on average, +-2 points per seed -- the remaining
                  netns noise is the runs', not only the oracle's
  netns, 2 seeds: model 6.1 (3.2 / 9.1), bandit 16.7 (7.6 / 25.7), heuristic 45.8, best static 48.6
                  (pipelined 4 / 8), switches 3.4; quiet lock exclusive, 9 minutes, load average
                  1.02 before, 0.32 / 0.41 / 1.29 after (with issue 18's transport merged). The
                  bandit ran 16.6 / 17.3 s, the model 16.7 / 16.4 s: seed 0's statics were slower
                  at (10 ms, 0.9) (oracle 7.76 ms/token split, 7.29 in-sample) than seed 1's (6.09),
                  so one seed's figure moves with its statics' noise as much as with the policy
Where the regret went before these changes (sim, per request against the oracle): the model lost
most on streams that started in cloud AR at 150 ms and ran into the 10 ms segment (0.4-0.7 s each:
only a stream's first segment measured the RTT), on pipelined 16 at 150 ms / alpha 0.9 picked on
alpha estimates of 0.93-0.95 where the steady state puts AR just ahead (0.2-0.56 s; the rounds'
overshoot of the token budget fixes it), and on the first request after alpha fell (the 6-position
change test never fired once the running value had drifted); the bandit on whole requests spent
exploring a kind (0.7 s for AR as the very first request), on DSD arms tried in every context an
estimate passed through, and on AR streams across 150 -> 10 ms. The sim also charged a whole extra
RTT to open every DSD session (the real edge does not wait for Opened), and let a falling link
reorder a stream's tokens. What is left: the model's losses are now mostly the inherent ones
(the first requests, the request an alpha or RTT step lands in: a stream queued for 150 ms drains
after the link falls); the bandit's are exploration (each kind and arm once per context; at 150 ms
a DSD round plus the hand-over back costs ~0.3 s) and per-seed variance (one early unlucky round
moves a seed by 5 points). Tried and not kept: scaling the model's DSD costs by measured over
predicted round time (6.4 against 6.1); unimodal-in-gamma arm exploration (stuck: 30% on a seed).
Session 8b, the bandit on sim seeds 0 / 1 / 2 (before: 9.3 / 14.7 / 11.6): a kind's value as its
best arm's raw rate had one sync 8 round at 150 ms (9 tokens in 0.178 s, above cloud AR's 50/s)
keep a request exploring ten DSD arms for a second; shrinking it gave 7.7 / 12.5 / 12.2, adding the
dominating-context borrow 8.3 / 11.7 / 10.2 (kept). Not kept: the kind's value as its pooled rate
(8.2 / 18.1 / 11.4: under-values DSD until the arms concentrate), UCB counts in time units rather
than rounds (9.2 / 15.4 / 10.6), exploration 0.05 (9.9 / 12.1 / 11.1), gammas (2, 4, 8, 16)
(9.1 / 10.4 / 12.2) and (1, 4, 16) (21.5 / 8.8 / 7.9 before the changes). What is left of the
bandit's: the first request's exploration (0.24-0.38 s), AR streams across 150 -> 10 ms at alpha
0.9 (0.45 s: the model's too), one DSD try in an AR stream per new context.

Session 9 (the bandit's informed prior: the closed form on the model's running estimates as 6
pseudo-rounds per arm, 6 chosen among 1.5 / 3 / 6 / 12 on sim seeds 3-5 -- bandit there 6.0 /
5.7 / 4.1 / 6.1, 12.3 uninformed -- not on the seeds reported; the netns oracle measured with the
link held still, every arm on the run's own prompts, split by prompt; the driver's stream step
floored by the server's compute per token):
  sim, 3 seeds (0-2):  model 3.8 (2.5 / 4.6 / 4.4), bandit 7.9 (7.2 / 8.9 / 7.4), heuristic 47.6,
                  best static 57.4 (pipelined 8), switches 3.0 (virtual time: load does not move
                  it; 7 minutes beside the other helper's tests). Scored with netns's constant-
                  condition split estimator instead: model 2.5 / 4.6 / 3.8, bandit 7.2 / 8.9 / 6.8.
                  The prior alone (before the step floor): bandit 9.6 / 8.9 / 7.4
  netns, first pair (the prior and the constant-condition oracle, before the step floor; quiet
  lock exclusive, one seed per command, 9.7 / 9.5 minutes, load average 2.38 / 1.65 before,
  0.21 / 0.70 / 1.44 and 0.15 / 0.39 / 0.94 after):
                  seed 0: model 4.0, bandit 4.8, heuristic 46.1, best static 53.5 (pipelined 4)
                  seed 1: model 12.3, bandit 14.7, heuristic 47.7, best static 50.4 (pipelined 8)
                  (scored with the older estimate under the schedule: 2.1 / 2.9 and 10.5 / 13.0;
                  with the constant-condition in-sample best: 4.8 / 5.7 and 12.4 / 14.9)
                  Seed 1's regret, per request: the bandit's AR stream that began at 150 ms ran
                  0.5 s into the 10 ms segment (0.49 s lost): the burst of tokens the slow link had
                  held back arrived with gaps of ~0.1 ms, which the driver took as the server's
                  step, so it asked for the rest of the request at once (four segments in 1 ms)
                  just as the link fell -- a bug, fixed by the step floor (tests/test_control.py);
                  the model lost 0.55 s on its first three requests (alpha still being estimated,
                  gammas 8-12 on prompts whose acceptance pattern made them slow) and 0.2 s on a
                  request begun in DSD at 150 ms on a probe from before the step.
  netns, judged (this code, the quiet lock exclusive, one seed per command):
                  seed 0: model 3.7, bandit 21.9, heuristic 45.5, best static 59.5 (sync 8),
                  switches 3.6 (9.4 minutes; load average 1.55 before, 0.14 / 0.77 / 1.39 after;
                  scored with the constant-condition in-sample best 4.6 / 23.3, with the estimate
                  under the schedule 1.7 / 19.3)
                  seed 1: model 14.1, bandit 13.9, heuristic 53.6, best static 48.9 (pipelined 8),
                  switches 3.1 (9.6 minutes, after merging main; load average 1.55 before, 0.12 /
                  0.51 / 1.21 after; in-sample constant 14.3 / 14.1, under the schedule 15.5 / 15.4)
                  mean of the two: model 8.9, bandit 17.9, heuristic 49.6, best static 54.2,
                  switches 3.4. The model's seed 1: 0.66 of its 1.19 s lost on one AR stream across
                  150 -> 10 ms whose tokens stalled 0.29 s at the step, exactly as the bandit's below
                  The bandit's seed-0 figure, per request: 0.64 of its 1.88 s lost on one AR stream
                  across 150 -> 10 ms whose tokens stalled 0.31 s at the link's step (tokens 1-11
                  arrived at once, 0.31 s late: the schedule's step held packets in flight -- netem,
                  left alone; session 8b's netns seed 1 showed the same 0.31 s stall at a step),
                  so the segment asked meanwhile measured a 230-285 ms RTT and the stream asked its
                  whole tail before the 17 ms measurement came; and 0.7 s in its first seven requests
                  (trying pipelined 4 / 8 and sync 16 on the seed's unlucky prompts). The same seed
                  in the first pair: 4.8. One netns seed of the bandit moves by this much between
                  runs; the model's stayed within 0.3 points (4.0, 3.7).
  netns, judged, the schedule's cuts draining in order (schedule_order = "queue", now the
                  experiment file's; the lead, 00:39-00:59 UTC 2026-12-02, quiet lock exclusive):
                  seed 0: model 3.6, bandit 6.1, heuristic 46.7, best static 53.1 (pipelined 8),
                  switches 3.6 (load average 0.35 after); seed 1: model 3.0, bandit 12.5, heuristic
                  48.6, best static 47.7 (pipelined 8), switches 3.3 (0.19 after); mean: model 3.3,
                  bandit 9.3, heuristic 47.7, best static 50.4. The stalls above were TCP: with
                  "path" a 150 -> 10 ms cut lets later packets overtake held ones and Linux answers
                  with a spurious RTO (benchmarks/step_reorder.py), which no oracle arm pays.
Seed 0's oracle at (10 ms, 0.9) is again slower than seed 1's (7.65 against 6.06 ms/token) with
every arm on the same prompts at a constant 10 ms: its prompts are the unlucky ones, so the 27%
of session 8b was the prompts, not the estimator; what the constant-condition oracle removes is
the mismatch of prompts between the arms and the policies.
Not done: an in-stream RTT probe (a Ping while streaming) to see a fall before the queued
segments drain. Worth at most the prefetch a round trip keeps asked (8-9 tokens at 150 ms, ~0.1 s
at alpha 0.9) per fall; the floor above removed the larger loss, the stream asking the whole tail.

Session 10 (2026-12-02): the model adds the verifier's queueing per server pass to its predictions
(dsd/policy_model.py); a single client measures none, and the default sim reads as before: model
3.8 (2.5 / 4.6 / 4.4), bandit 7.9 (7.2 / 8.9 / 7.4), heuristic 47.6, best static 57.4, switches 3.0.
The replayed trace, ``--rtt-trace experiments/traces/roaming-de.csv`` (27 / 114 / 174 ms, RIPE
Atlas country-pair means; 48 segments of 3 s + Exp(mean 3 s)):
  sim, 3 seeds:   model 4.9 (5.9 / 4.6 / 4.2), bandit 5.6 (6.3 / 5.0 / 5.6), heuristic 117.2 (it has
                  no cloud AR: alpha 0.3 at 114-174 ms costs it double), best static 38.9 (cloud AR),
                  switches 1.1, goals_met=True (virtual time; 5.5 minutes beside CI). Oracle ms/token
                  (seed 0): (27, 0.9) 8.32, (114, 0.9) 20.10, (174, 0.9) 23.63 (= AR), (27 / 114 /
                  174, 0.3) 20.56 / 22.38 / 23.63 (AR; its request's first round trip included)
  netns, seed 0 (--requests 20 --alpha-requests 5; quiet lock exclusive, 14.4 minutes, over the
                  ~12 a command should hold it: three levels' constant-condition oracle; load
                  average 1.03 before, 0.45 after): model 10.7, bandit 11.8, heuristic 135.9, best
                  static 35.6 (cloud AR), switches 3.5. A policy's run lasts 13 s, so only the
                  trace's first segments (27 -> 174 -> 114 ms at 8.6 and 11.7 s) and four alpha
                  changes: the model lost 1.03 s in 11.6, 0.21 s on its first request and 0.97 s
                  on the four requests an alpha change or the RTT step landed in (the rest -0.15 s:
                  prompt luck either way); oracle ms/token (27, 0.9)
                  10.26, (27 / 114 / 174, 0.3) 21.11 / 23.91 / 25.64 (AR), (114 / 174, 0.9) 24.52 /
                  25.75
The default scenario on netns, a third seed (this code: the model's queueing term measured 0 --
a hand-over segment's first step waits 7-80 ms behind the segment before, which it leaves out):
  seed 2:         model 10.8, bandit 8.4, heuristic 50.7, best static 47.7 (pipelined 8), switches
                  3.2 (quiet lock exclusive, 13.6 minutes, load average 0.77 before, 0.11 after;
                  in-sample constant 10.8 / 8.4, under the schedule 5.2 / 3.0). The model lost 1.14 s
                  in 13.2: 0.35 s on two AR streams at alpha 0.3 caught by a 10 -> 150 ms step (the
                  tokens in flight arrive 140 ms late; no constant-condition arm pays that), ~0.24 s
                  on the requests after an alpha change, the rest spread. Seeds 0-2 (0-1 from the
                  lead's run above): model 5.8, bandit 9.0, heuristic 48.7, best static 49.5
Session 11 (2026-12-02, code 9b57109: the policies as in session 10; the probes now SCHED_FIFO),
two new seeds, one per command, quiet and netns locks held, 9.9 / 9.7 minutes, load average
0.85 / 0.08 before, 0.08 / 0.23 after; the judged figure (written down before the runs) is the
mean over seeds 0-4 with its standard error:
  seed 3:         model 8.6, bandit 8.9, heuristic 47.1, best static 47.0 (pipelined 8), switches 5.3
  seed 4:         model 4.4, bandit 6.7, heuristic 47.4, best static 53.4 (pipelined 8), switches 4.1
  seeds 0-4:      model 6.1 +- 1.5 (3.6 / 3.0 / 10.8 / 8.6 / 4.4), bandit 8.5 +- 1.1 (6.1 / 12.5 / 8.4
                  / 8.9 / 6.7), heuristic 48.1, best static 49.8: the bandit's goal (10) is met, the
                  model's (5) is within one standard error and not shown; both beat the heuristic,
                  and the model is far more than 15% better than the best static choice
Session 12 (2026-12-02, code 70dd45e): the model keeps a server stream asked for the slowest link
level seen while no edge plan would take the request back even on the fastest link seen
(dsd/policy_model.py ``stream_ahead_s``), instead of one measured RTT ahead: an AR stream at alpha
0.3 caught by a 10 -> 150 ms step no longer leaves the server idle until a segment shows the new
RTT (seed 2's request 21: 173 -> 61 ms lost).
  sim, 3 seeds:   model 3.3 (2.1 / 3.7 / 4.0; was 2.5 / 4.6 / 4.4), bandit 7.9 (unchanged: it has
                  no look-ahead), heuristic 47.6, best static 57.4, switches 2.6
  sim, 3 seeds, --rtt-trace experiments/traces/roaming-de.csv: model 4.6 (5.4 / 4.3 / 4.2; was
                  5.9 / 4.6 / 4.2), bandit 5.6, heuristic 117.2, best static 38.9, switches 1.1
  netns, seeds 0-4 (written down before the runs: /work/notes/session12-plan.md; one seed per
  command, quiet and netns locks held, 9.3-12.5 minutes each, load average 0.1-1.5 before):
                  model 5.0 +- 0.2 (4.6 / 5.2 / 5.4 / 5.6 / 4.4; was 3.6 / 3.0 / 10.8 / 8.6 / 4.4,
                  paired change -1.0 +- 1.4), bandit 7.2 +- 0.9 (9.9 / 6.8 / 5.5 / 8.5 / 5.2),
                  heuristic 49.5 (seed 0: 66.1, its static sync arms 2-5 s slower than other seeds'),
                  best static 48.6, switches 3.2-4.9. The model's spread fell from 3.0-10.8 to
                  4.4-5.6, its mean from 6.1 to 5.0: the goal (5) is not shown (not below it).
                  Where the rest goes (per request, against the oracle): the run's first 10 -> 150
                  step in an AR stream, 0.15-0.23 s per seed (nothing slower seen yet to look
                  ahead for); an alpha-0.9 AR stream begun at 150 ms that the link's fall to 10 ms
                  leaves on the server, 0.17-0.37 s on four seeds of five (the stream is asked
                  ~170 ms ahead, and the first segment that sees the fall is served after all of
                  it: an acknowledgement of each Generate and a way to withdraw asked segments
                  would let it come back); the first request after an alpha change, 0.06-0.24 s
Session 13 (2026-12-02, code b53dc2b): before a slower level is seen the look-ahead is at least
``ControllerConfig.stream_ahead_floor_s`` = 0.2 s (RIPE Atlas's ping-weighted p90 country-pair mean
RTT), so the run's first 10 -> 150 step is covered too.
  sim, 3 seeds:   model 2.3 (1.3 / 2.7 / 2.8; was 2.1 / 3.7 / 4.0), bandit 7.9, heuristic 47.6, best
                  static 57.4, switches 2.4 (2.4 minutes)
  netns, seeds 0-4 (the rule of session 12, written down before the runs; one seed per command,
  quiet and netns locks held, 9.8 minutes each, 11:47-12:36 UTC, load average 0.1-0.3 before):
                  model 4.8 +- 1.5 (4.5 / 0.8 / 10.1 / 5.4 / 3.2), bandit 8.4 +- 0.4 (7.6 / 8.5 / 9.6
                  / 8.8 / 7.3), heuristic 47.6, best static 51.5, switches 3.2-3.8: the model's goal
                  (mean + SE <= 5) is not shown. Seed 1 on the code before the floor (69e95de), a
                  diagnostic run at 11:36: model 2.2 (5.2 in session 12): one seed moves by 3
                  points between runs. Per request: the run's first step cost <= 0.08 s on
                  four seeds (the floor); three seeds lost 0.13-0.18 s at a 10 -> 150 step within
                  a server request's first 12 positions (``STREAM_AHEAD_POSITIONS``: no look-ahead
                  yet); the alpha-0.9 stream across 150 -> 10, 0.12-0.20 s on four seeds; the
                  requests an alpha change lands in, 0.06-0.28 s. The positions gate on sim seeds
                  3-5 (not the reported ones; sim requests are 48 tokens, segments 6 s): 12 -> 3.5,
                  4 -> 3.3, 1 -> 3.5 (not judged on netns; left at 12)
Session 14 (2026-12-02, code 9fb6ee7): every hand-over segment is acknowledged as it arrives
(wire.Queued: an RTT sample within one round trip) and, after the link fell to half the RTT the
asked segments were asked on or less, the driver withdraws those beyond a round trip of the new
link (wire.Withdraw / Withdrawn; the sim lays segments out when they start).
  sim, 3 seeds:   model 2.3 (1.3 / 2.7 / 2.9), bandit 6.7 (5.4 / 7.6 / 7.1; was 7.9), heuristic 47.6,
                  best static 57.4, switches 2.4. Withdrawing on every plan back to the edge (also
                  on a steady link) gave model 2.6 (seed 2: 3.9; the asked look-ahead tokens had
                  damped plans moved by a noisy alpha estimate), hence the link-fell condition
  netns, seeds 0-4 (the rule of sessions 12-13, written down before the runs: /work/notes/
  session14-plan.md; one seed per command, quiet and netns locks held, 15:57-16:46 UTC):
                  model 4.6 +- 1.2 (3.9 / 1.8 / 9.1 / 4.3 / 3.7), bandit 9.4 +- 1.8 (6.1 / 7.3 / 16.3 /
                  8.2 / 8.9), heuristic 47.9, best static 52.4, switches 3.3-4.4: neither 5 (model)
                  nor, this time, 10 (bandit) is shown by mean + SE. Seed 2's alpha-0.9 stream across
                  the fall: 0.20 -> 0.09 s lost; on seeds 1, 3, 4 the fall came 0.06-0.07 s before
                  that request's end (nothing to withdraw). The bandit's seed 2 diverged in request
                  1 (DSD, no hand-over) by timing noise. Left: a request starting just after a
                  fall is decided on the last periodic probe, which read 106 ms (sent while the
                  old link's packets drained), and starts in AR (seed 3 request 14, 0.26 s)
  then (e038958, after CI's compose run sent a 5 ms edge to AR on a stalled first block): the
  model's draft-step estimate is a Level and no round is planned before two rounds measured it.
  sim, 3 seeds:   model 2.1 (1.4 / 1.1 / 3.8), bandit 6.7, heuristic 47.6, best static 57.4 (not
                  judged on netns; the figures above are 9fb6ee7's)
Session 15 (2026-12-03, code 4a752e0): an adaptive request is decided on the last periodic probe only
if it was sent after the previous request's last arrival (else the policy's running estimate;
services.edge.probe_for_request_s), and the acceptance's change test needs 2.5 nats, not 4, for the
run of the whole current request (dsd/estimators.py Acceptance: a new prompt may bring a new alpha).
Per request: benchmarks/adaptive_regret.py on the --save pickle.
  netns, seed 2, diagnostic (the probe rule alone, bf19e12; 06:49 UTC): model 8.5, bandit 9.4; its
                  two alpha-drop requests (6, 18: 0.9 -> 0.3 at 10 ms) drafted 9 rounds of gamma 8-10
                  before the estimate fell (0.11 and 0.13 s lost); replayed from rounds.csv with the
                  new threshold, 3-5 rounds (old 6-8), no more restarts on later same-class requests
  sim, 3 seeds:   model 1.9 (1.3 / 1.1 / 3.3), bandit 6.8 (5.5 / 7.6 / 7.1), heuristic 47.6, best static
                  57.4, switches 2.3
  netns, seeds 0-4 (the rule of sessions 12-14, written down before the runs: /work/notes/
  session15-plan.md; one seed per command, quiet and netns locks held, 07:09-07:57 UTC, load
  average 0.1-0.8 before):
                  model 4.2 +- 1.0 (4.1 / 1.4 / 6.1 / 3.0 / 6.6), bandit 6.9 +- 0.2 (6.2 / 7.3 / 6.9 / 6.9 /
                  7.0), heuristic 47.0, best static 49.1, switches 3.1-4.2: the bandit's goal (10) is
                  shown, the model's (5) is not (mean + SE 5.2). Paired with session 14 seed by seed:
                  model -0.3 +- 1.0, bandit -2.5 +- 1.8 points. The alpha-drop requests lost
                  0.03-0.11 s (seed 2: 0.04 / 0.05, was 0.11 / 0.13). New loss, from the lower
                  threshold: on seeds 0 and 4 the first alpha-0.9 request after the 0.3 class (request
                  12, cloud AR at 150 ms) restarted its estimate on its first six shadow matches to
                  ~1.0, the plan went to pipelined DSD (predicted faster at alpha ~1), the stream
                  stopped being asked, and the next miss brought the plan back after a round trip of
                  idle server (0.17 and 0.13 s). Keeping the old rate as 2 positions beside a restarted
                  run was tried in a replay only (not kept): the estimate still climbed to 0.93-0.95 on
                  streaks of matches, where DSD at 150 ms is predicted faster than AR. Seed 3's request
                  14 (0.26 s) is not what the probe rule addresses: the fall came 7 ms before request 13's
                  last token arrived (a token the old link carried; 14 began 77 ms after the fall), so no round trip had measured
                  it yet and the running estimate still read 150 ms (the probe, 142 ms, was set
                  aside as older than request 13's end, as it should be); the request
                  starts in AR with two segments asked, the first acknowledgement shows 10 ms, and the
                  second segment is not withdrawn because a request's first segments carry no RTT and
                  no server step is measured yet (dsd/driver.py ``_beyond_a_round_trip``): the next fix

Session 16 (2026-12-03, code 457d895): (1) a hand-over segment carries the RTT its plan was decided
on (the controller's link_rtt_s()) until the request measures the link, and before the server's
pace is known only the first segment is kept when the link has fallen (dsd/driver.py
``_beyond_a_round_trip``); (2) a request on the server comes back to the edge, within the request
(``ModelPolicy.decide``, and ``stream_ahead_s`` by the same rule) and at the next request
(``decide_request``), only if that pays off at alpha's Wilson lower bound too (z = 1, on the
discounted positions: ~10 for shadow drafts); (3) the policies also against a prompt-matched
oracle (benchmarks/adaptive_oracle.py ``prompt_matched_oracle``), printed, not judged.
  netns, seed 3, diagnostic: 0384f3d model 4.2, b3b850a (1 and the in-request part of 2) 4.3. Its
                  request 14 (0.26 s both times) is the prompt, not the withdraw gap session 15 named:
                  the fix did act (cloud AR for 4 tokens, not 8), but the prompt's realised
                  acceptance is low (static pipelined 8 took 0.46 s on it, the class's oracle 0.25 s)
  sim, 3 seeds:   model 1.7 (1.1 / 1.0 / 3.0; 0384f3d 1.9), bandit 6.8 (unchanged); prompt-matched
                  model 2.3 +- 0.1. The flickers AR -> DSD -> AR at 10 ms on 0.3-class prompts are gone.
  netns, seeds 0-4 (the rule of sessions 12-15, written down before the runs: /work/notes/
  session16-plan.md; one seed per command, quiet and netns locks held, 18:48-19:36 UTC, load
  average 0.05-0.5 before):
                  model 5.3 +- 0.9 (6.2 / 2.4 / 7.5 / 4.2 / 6.3), bandit 7.3 +- 0.3 (6.1 / 7.7 / 7.2 /
                  8.0 / 7.7), heuristic 47.4, best static 48.9, switches 2.7-4.0; prompt-matched:
                  model 5.2 +- 1.0, bandit 6.8 +- 1.0. The bandit's goal is shown again (mean + SE
                  7.7); the model's is not (6.2), and paired with session 15 seed by seed the model
                  is worse by 1.1 +- 0.4 points (heuristic and best static moved < 0.5): the
                  prediction (3.6 +- 0.9) was wrong. Where it went: the requests a 10 -> 150 ms step
                  lands in, on 0.3-class prompts, lost 0.04-0.22 s a seed (mean 0.11 s, ~0.9 points);
                  they now start in cloud AR (the lower-bound rule) where before they started in DSD
                  and handed over, and a stream is kept asked ahead only once its shadow drafts
                  (one position a token) have covered STREAM_AHEAD_POSITIONS = 12, so a step within
                  its first ~0.25 s leaves the server idle for a round trip. Dropping that gate is
                  not the fix: in the sim it costs the alpha-0.9 streams across 150 -> 10 ms (model
                  1.7 -> 3.8). The 150 -> 10 ms streams at alpha 0.9 still lose 0.06-0.26 s. Seed 2
                  ran request 13 in cloud AR to its end, 0.15 s past the fall: its last segment
                  (tokens 28-31) was asked at +0.679 s, the tokens the old link held arrived in a
                  burst at +0.699 s, and no Generate was sent after the fall (the whole budget was
                  asked), so nothing measured the new link (a Generate sent before a fall measures
                  old one-way + new one-way, ~80 ms, not a fall by LINK_FELL_RATIO). Next: take such
                  a burst, or a probe, as the measurement.

Session 17 (2026-12-03/04, code ac91260 judged): (1) a server stream is kept asked ahead from its
first segment (the 12-position gate dropped), and the segments asked only for that look-ahead
(dsd/driver.py ``Segment.ahead``) are withdrawn when the plan goes back to the edge, which is what
made dropping the gate cost the sim in session 16 (now sim model 1.7 both ways); (2) a burst of
stream tokens arriving faster than the server's pace reads as a fall of the link
(dsd/stream_drift.py: drift of the arrivals below the pace against the lowest before the burst,
both directions assumed to have fallen alike), where no Generate is left to measure it; its guess
moves the model's link level, not the fastest link measured; (3) a request's first 3-5 positions
may restart the acceptance estimate at 4 nats (three rejections after a run at 0.9).
  netns, seed 0, diagnostic: session 16's code 6.2; (1) and (2) 5.4, with the floor kept 5.2,
                  with (3) 5.1. Requests 9 and 22 (10 -> 150 ms on 0.3-class prompts in cloud AR)
                  lost -0.01 / -0.04 s instead of 0.10 / 0.12; the burst was read at 8.019 s in
                  request 13 (40 ms, then 7.5 ms), the request came back to DSD after the segment
                  being served, but that prompt's last 4 tokens drafted badly (2 tokens a round).
  sim, 3 seeds:   model 1.7 (1.1 / 0.9 / 3.0), bandit 6.6; the sim's steps do not land early in
                  cloud-AR requests, so (1) shows only on netns.
  netns, seeds 0-4 (the rule of sessions 12-16, written down before the runs: /work/notes/
  session17-plan.md; one seed per command, quiet and netns locks held, 23:26-00:13 UTC, load
  average 0.04-0.9 before):
                  model 4.9 +- 1.0 (5.3 / 2.1 / 8.2 / 3.9 / 5.2), bandit 7.4 +- 0.6 (7.2 / 9.0 / 8.0 /
                  7.4 / 5.6), heuristic 47.4, best static 48.1, switches 2.5-4.0; prompt-matched:
                  model 4.7 +- 1.0, bandit 6.9 +- 1.0. The bandit's goal is shown (mean + SE 8.0);
                  the model's is not (5.9). Paired with session 16 seed by seed: model -0.4 +- 0.3,
                  bandit +0.1 +- 0.6 points; the prediction (4.3 +- 0.9) was optimistic. Seconds
                  lost a seed, session 16 -> 17, by the requests' condition: 10 -> 150 ms at 0.3
                  0.112 -> 0.041 (what (1) is for), 150 -> 10 ms at 0.9 0.128 -> 0.106, the first
                  request 0.082 both, 10 ms at 0.3 (the alpha drops) 0.141 -> 0.123, 10 ms at 0.9
                  0.047 -> 0.065 (prompts and timing), 150 ms at 0.3 0.042 -> 0.053. Seed 2's
                  request 14 started in cloud AR (+0.06 s; DSD in session 16): after the burst read
                  the link at 10 ms, the first tokens of a segment asked before the fall measured
                  80 ms (out on the old link, back on the new) and pulled the estimate to 47 ms,
                  where at alpha's lower bound cloud AR won. Since then (034d3c8, not judged) a
                  segment asked before a burst read as a fall does not measure the link
                  (dsd/driver.py ``_asked_before_the_fall``): netns seed 2 again, diagnostic, 5.9
                  (its request 14 in DSD, +0.01 s), prompt-matched 4.7; sim unchanged (1.7, 6.6).
                  Left: the segment being served when the plan goes back (up to handover_tokens at
                  the server's pace, 80 ms here: a Withdraw cannot cut it), the first request's
                  cold start (0.08 s a seed), and draft blocks longer than the budget left (the
                  model drafted 90 steps past its requests' ends on seed 0; static pipelined 8 ~6 a
                  request).

Session 18 (2026-12-04, code cb9adca judged): a stream begun on the server is asked a round trip
ahead on the pace the controller learnt in earlier requests (dsd/driver.py ``_pace``: the policy's
``link_rtt_s()`` and ``server_step_s()``), not kept two segments ahead until its first token
measured the step: 8 tokens of a 20 ms server are less than a 150 ms round trip and a step, so the
server idled ~12 ms in every cloud AR request at 150 ms (session 17's "150 ms at 0.3" loss).
  sim, 3 seeds:   model 1.3 (0.6 / 0.8 / 2.6), bandit 5.9 (ac91260: 1.7, 6.6). Tried, not kept: a
                  longer memory for the acceptance estimate (discount 0.95 / 0.97 instead of the
                  0.9 of the other estimates): model 1.8 both.
  netns, seed 0, diagnostic: 4.6 (judged session 17: 5.3); its AR requests at 150 ms lost 0.000 s each.
  netns, seeds 0-4 (the rule of sessions 12-17, written down before the runs: /work/notes/
  session18-plan.md; one seed per command from a worktree of cb9adca, quiet and netns locks held,
  03:54-04:45 UTC):
                  model 4.5 +- 0.7 (4.9 / 2.5 / 5.7 / 3.2 / 6.2), bandit 6.8 +- 0.4 (7.2 / 6.4 / 8.0 /
                  7.0 / 5.5), heuristic 47.2, best static 47.8, switches 2.5-3.7; prompt-matched:
                  model 4.2 +- 1.1, bandit 6.0 +- 0.4. The bandit's goal is shown (mean + SE 7.2);
                  the model's is not (5.2; predicted 4.0 +- 0.9). Paired with session 17 by seed:
                  model -0.4 +- 0.6, bandit -0.6 +- 0.5 points. Seconds lost a seed, session 17 ->
                  18, by the requests' condition: 150 ms at 0.3 0.053 -> 0.001 (the fix), 150 -> 10
                  ms at 0.9 0.106 -> 0.067 (034d3c8), 10 -> 150 ms at 0.3 0.041 -> 0.026, the alpha
                  drops 0.123 -> 0.110, the first request 0.082 both, 10 ms at 0.9 0.065 -> 0.083;
                  total 0.47 -> 0.35 s. The figure moved less than the seconds because it counts
                  tokens the oracle would have emitted: a second at 150 ms is worth 40 of them, one
                  at (10 ms, 0.9) 130-170 (oracle 5.9-7.6 ms a token, which also moves by seed: seed
                  4 lost 0.38 s both sessions and scored 5.2 then, 6.2 now). What is left is at 10
                  ms: the first request (its prompt's luck and pipelined 16 planned on 12 accepted
                  of 12), the alpha drops (three rounds before the estimate falls; two would need
                  two rejections to restart at 0.9, one 0.9-class request in a hundred), the prompts
                  of the 0.9 class, and the fall's in-flight tokens (a Withdraw cannot cut the
                  segment being served: ~0.04 s when it lands late in a request).
Session 19 (2026-12-04, code 6fb5c4d judged): the model's first plan comes after two measured
draft rounds, counted (``Discounted.count``): the Level's discounted weight, 1.9 after two, held
every run's first request a third round in sync 4; and while a request has not measured the link,
its stream's first segment asks one token and the next the rest of ``handover_tokens`` (the first
segment is the one a Withdraw cannot take back; a request sent to cloud AR on a stale 150 ms just
after the link fell to 10 ms served its 4 tokens first: seeds 1, 3, 4 of session 18, request 14).
  sim, 3 seeds:   model 1.2, bandit 5.9 (cb9adca: 1.3, 5.9); the sim decides each request on the
                  link in force, so the stale case does not arise there: unchanged elsewhere.
  netns, seed 4, diagnostic: model 5.7, bandit 5.4.
  netns, seeds 0-4 (the rule of sessions 12-18, written down before the runs: /work/notes/
  session19-plan.md; one seed per command from a worktree of 6fb5c4d, 10:13-11:00 UTC):
                  model 4.5 +- 0.8 (4.4 / 1.8 / 6.2 / 4.0 / 6.2), bandit 6.9 +- 0.7 (7.2 / 8.1 / 8.5 /
                  5.3 / 5.6), heuristic 47.3, best static 47.7, switches 2.3-3.2; prompt-matched:
                  model 4.3 +- 1.2, bandit 6.3 +- 1.0. The bandit's goal is shown (mean + SE 7.6);
                  the model's is not (5.3; predicted 4.1 +- 0.8). Paired with session 18 by seed:
                  model +0.0 +- 0.3, bandit +0.1 +- 0.6. Seconds lost a seed, session 18 -> 19: the
                  first request 0.081 -> 0.054, 10 -> 150 ms at 0.3 0.026 -> -0.001, the alpha drops
                  0.108 -> 0.114, 10 ms at 0.9 0.084 -> 0.081, cloud AR across 150 -> 10 ms at 0.9
                  0.067 -> 0.129 (four seeds of five had such a request this time, two before: where
                  the fall lands among the requests moves a seed by 1-2 points). On seed 3 the
                  model's request 14 began as the link fell: its first segment's round trip was
                  half on each link (62 ms), so it stayed in AR, and with the stream asked 0.2 s
                  ahead from the start the next measurement came with the next segment asked, 0.28
                  s later (16 tokens on the server, 0.36 s lost).
  After the judged runs (4be4c66, not judged): a plan that stays on the server across a fall
  withdraws the segments asked beyond the new link's needs and asks again as the stream goes on,
  so the asks' acknowledgements measure the link (sim test: 8 tokens on the server instead of 28).
  sim, 3 seeds:   model 1.2 (unchanged), bandit 6.0 (its exploration's paths move: -0.15 to +0.2 s
                  a seed).
  netns, seed 3, diagnostic: model 2.8, bandit 4.8 (judged 6fb5c4d: 4.0, 5.3); its request 14
                  began at 10 ms this time and served one token on the server, then pipelined.
Session 20 (2026-12-04, code 4272b63 = 4be4c66 and docs, judged).
  netns, seeds 0-4 (the same rule, written down before the runs: /work/notes/session20-plan.md;
  one seed per command from a worktree of 4272b63, 13:24-14:13 UTC):
                  model 4.0 +- 1.0 (2.9 / 1.5 / 6.1 / 3.2 / 6.4), bandit 6.7 +- 0.9 (4.3 / 9.3 / 8.1 /
                  6.3 / 5.5), heuristic 46.8, best static 47.9, switches 2.2-3.8; prompt-matched:
                  model 4.3 +- 1.4, bandit 6.2 +- 1.4. Both goals are shown: the model's at its edge
                  (mean + SE 4.98; predicted 4.0 +- 0.8), the bandit's (7.6). Paired with session 19
                  by seed: model -0.5 +- 0.3, bandit -0.2 +- 0.7. Seconds lost a seed, session 19 ->
                  20: total 0.365 -> 0.366; cloud AR across 150 -> 10 ms at 0.9 0.129 -> 0.105, 10 ms
                  at 0.9 0.081 -> 0.048 (prompts), 150 ms at 0.3 0.001 -> 0.035 (three stalls of
                  30-150 ms inside the model's AR streams: seed 0 request 10, seed 3 requests 22-23;
                  tokens held, then a burst, ACK-clocked at the verifier's TCP sender: the README's
                  "Stalls in server streams"), 10 -> 150 ms at 0.3 -0.001 -> 0.013, the alpha
                  drops 0.114 -> 0.116, the first request 0.054 -> 0.052. The
                  straddled fall is mostly the oracle's: it emits at the 10 ms pace from the fall's
                  instant, while the tokens asked before it still come at the server's 20 ms.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM  # noqa: E402
from dsd.control import make_controller  # noqa: E402
from dsd.profiles import get_profile  # noqa: E402
from dsd.stopping import StopRule  # noqa: E402
from dsd.times import ComputeTimes  # noqa: E402
from orchestrator.launchers.sim import run_request  # noqa: E402
from benchmarks.adaptive_scenario import (CLASS_TOKEN, GAMMAS, POLICIES, RequestRun, Scenario,  # noqa: E402,F401
                                          arms, load_rtt_trace, matched_vs_oracle_pct, oracle_tokens,
                                          policy_config, vs_oracle_pct)


def print_matched(per_seed: list[tuple[dict, dict]], matched: list[dict], scenario: Scenario, first_seed: int) -> None:
    """The policies against the prompt-matched oracle, mean +- SE and per seed from ``first_seed``
    (a diagnostic beside the judged figures: it takes the prompts' luck out of the comparison)."""
    pct: dict[str, list[float]] = {name: [] for name in POLICIES}
    for (results, _), oracle in zip(per_seed, matched):
        for name in POLICIES:
            pct[name].append(matched_vs_oracle_pct(results[name], oracle, scenario))
    print(f"prompt-matched oracle (not judged; seeds {first_seed}-{first_seed + len(matched) - 1}): " + " ".join(
        f"{name}={statistics.mean(v):.1f}+-{statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0.0:.1f}% "
        f"({' / '.join(f'{x:.1f}' for x in v)})" for name, v in pct.items()), flush=True)


def switches_per_100(runs: list[RequestRun]) -> float:
    plans = [p for r in runs for p in r.plans]
    return 100.0 * sum(a != b for a, b in zip(plans, plans[1:])) / max(len(plans), 1)


# ---- sim: the real protocol code on virtual time ------------------------------------------------

def sim_costs(profile, gamma_max: int) -> ComputeTimes:
    return profile.times.tabulated(range(1, gamma_max + 1))


def sim_run(scenario: Scenario, pair, costs: ComputeTimes, prompts, arm=None, policy=None, rtt_ms=None) -> list[RequestRun]:
    """The requests one after another on one virtual clock; ``rtt_ms`` fixes the link."""
    draft, target = pair
    stop = StopRule(scenario.tokens)
    out, clock_s = [], 0.0
    for index, prompt in enumerate(prompts):
        start_s = clock_s
        rtt_at = (lambda t, s=start_s: scenario.rtt_at_ms(s + t) / 1e3) if rtt_ms is None else \
            (lambda _t: rtt_ms / 1e3)
        mode, gamma = arm or ("sync", 4)
        tokens, rounds, wall_s, _ = run_request(mode, draft, target, prompt, gamma, rtt_at(0.0), stop, costs, 1,
                                                f"r{index}", policy=policy, gamma_max=scenario.gamma_max,
                                                rtt_at=rtt_at)
        plans = [(r.gamma, r.mode) if r.mode else (gamma, mode) for r in rounds if not r.stale]
        out.append(RequestRun(start_s, wall_s, len(tokens), draft.config.alpha_of(prompt), plans))
        clock_s += wall_s
    return out


def sim_seed(scenario: Scenario, profile, seed: int) -> dict[str, list[RequestRun]]:
    config = SyntheticConfig(alpha=scenario.alphas[0], seed=seed, alpha_classes=scenario.alpha_classes())
    pair = (SyntheticLM(config, "draft"), SyntheticLM(config, "target"))
    costs = sim_costs(profile, scenario.gamma_max)
    prompts = scenario.prompts(seed)
    results = {f"static {m} {g}": sim_run(scenario, pair, costs, prompts, arm=(m, g)) for m, g in arms(scenario)}
    for name in POLICIES:
        results[name] = sim_run(scenario, pair, costs, prompts, policy=make_controller(policy_config(name, scenario)))
    return results


def sim_oracle(scenario: Scenario, profile, seed: int) -> tuple[dict, dict, dict]:
    """Each static arm at each constant (RTT, alpha), on the run's own prompts of that class: its
    per-token time; the best per condition (in-sample: chosen and scored on the same prompts,
    the sim's oracle), the netns estimator's split by prompts beside it
    (benchmarks/adaptive_oracle.py ``constant_oracle``, every arm on every prompt here), and the
    prompt-matched oracle (``prompt_matched_oracle``)."""
    from benchmarks.adaptive_oracle import constant_oracle, prompt_matched_oracle

    config = SyntheticConfig(alpha=scenario.alphas[0], seed=seed, alpha_classes=scenario.alpha_classes())
    pair = (SyntheticLM(config, "draft"), SyntheticLM(config, "target"))
    costs = sim_costs(profile, scenario.gamma_max)
    prompts = scenario.prompts(seed)
    measured: dict = {}
    for k, alpha in enumerate(scenario.alphas):
        mine = [i for i in range(len(prompts)) if scenario.alpha_class(i) == k]
        for rtt in scenario.levels_ms():
            for a in arms(scenario):
                runs = sim_run(scenario, pair, costs, [prompts[i] for i in mine], arm=a, rtt_ms=rtt)
                measured.setdefault(a, {})[(rtt, alpha)] = [(i, r.wall_s, r.tokens) for i, r in zip(mine, runs)]
    split, in_sample = constant_oracle(measured)
    return in_sample, split, prompt_matched_oracle(measured)


def check_netns_oracle(seed: int, results: dict, best_s: dict, split_c: dict, scenario: Scenario) -> None:
    """The netns oracle's estimators on the sim's runs, beside the sim's own oracle (each arm at
    each constant condition, in-sample over all the class's prompts): netns's constant-condition
    split by prompts (benchmarks/adaptive_oracle.py ``constant_oracle``), and the older estimator
    from the static runs under the schedule (split, in-sample); the policies scored with each."""
    from benchmarks.adaptive_oracle import in_sample_oracle, print_oracle, split_oracle

    statics = {k: v for k, v in results.items() if k.startswith("static")}
    split = split_oracle(statics, scenario)
    print_oracle(f"seed {seed} constant-condition (constant split; schedule split, in-sample)", best_s, split_c,
                 split, in_sample_oracle(statics, scenario))
    for label, oracle in (("constant-condition split", split_c), ("under-the-schedule split", split)):
        if all(k in oracle for k in best_s):
            print(f"  seed {seed} vs the {label} oracle: " + " ".join(
                f"{name}={vs_oracle_pct(results[name], oracle, scenario):.1f}%" for name in POLICIES), flush=True)


# ---- report ----------------------------------------------------------------------------------------

def summarise(per_seed: list[tuple[dict, dict]], scenario: Scenario, first_seed: int = 0) -> dict[str, float]:
    pct: dict[str, list[float]] = {name: [] for name in (*POLICIES, "best_static")}
    switch_rates = []
    for seed, (results, best_s) in enumerate(per_seed, first_seed):
        statics = {k: vs_oracle_pct(v, best_s, scenario) for k, v in results.items() if k.startswith("static")}
        best_static = min(statics, key=statics.get)
        pct["best_static"].append(statics[best_static])
        for name in POLICIES:
            pct[name].append(vs_oracle_pct(results[name], best_s, scenario))
        switch_rates.append(switches_per_100(results["model"]))
        modes = {}
        for r in results["model"]:
            for _, m in r.plans[:1]:
                modes[m] = modes.get(m, 0) + 1
        print(f"seed {seed}: " + " ".join(f"{k}={v[-1]:.1f}%" for k, v in pct.items())
              + f" (best static: {best_static}; model's request modes {modes})", flush=True)
    out = {f"{k}_vs_oracle_pct": statistics.mean(v) for k, v in pct.items()}
    out["switches_per_100_rounds"] = statistics.mean(switch_rates)
    return out


def plot(results: dict, scenario: Scenario, path: Path) -> None:
    """The chosen gamma (and mode, by colour) of every live round over the run, against the RTT
    schedule (or trace) and the prompts' alpha, for every policy (rounds placed evenly within
    their request's wall time)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"sync": "tab:blue", "pipelined": "tab:green", "ar": "tab:red", "colocated": "tab:purple"}
    names = [n for n in POLICIES if n in results]
    fig, axes = plt.subplots(len(names) + 1, 1, figsize=(11, 2.4 * (len(names) + 1)), sharex=True)
    end_s = max(r.start_s + r.wall_s for n in names for r in results[n])
    ts = [i * end_s / 2000 for i in range(2001)]
    axes[0].step(ts, [scenario.rtt_at_ms(t) for t in ts], where="post", color="black", label="RTT (ms)")
    axes[0].set_ylabel("RTT ms")
    twin = axes[0].twinx()
    for r in results[names[0]]:
        twin.hlines(r.alpha, r.start_s, r.start_s + r.wall_s, color="tab:orange")
    twin.set_ylabel("alpha", color="tab:orange")
    twin.set_ylim(0, 1)
    for ax, name in zip(axes[1:], names):
        for r in results[name]:
            n = max(len(r.plans), 1)
            for i, (gamma, mode) in enumerate(r.plans):
                ax.scatter(r.start_s + (i + 0.5) * r.wall_s / n, gamma if mode not in ("ar",) else 0,
                           s=6, color=colours.get(mode, "grey"))
        ax.set_ylabel(f"{name}: gamma")
        for mode, colour in colours.items():
            ax.scatter([], [], color=colour, label=mode + (" (at 0)" if mode == "ar" else ""))
        ax.legend(loc="upper right", fontsize=7, ncol=4)
    axes[-1].set_xlabel("time in the run (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def goals_met(s: dict[str, float]) -> bool:
    model, bandit, heur, static = (s[f"{k}_vs_oracle_pct"] for k in ("model", "bandit", "heuristic", "best_static"))
    # "at least 15% better than the best static": the static's per-token time at least 15% above the model's
    return (model <= 5 and bandit <= 10 and (100 + static) >= 1.15 * (100 + model)
            and model < heur and bandit < heur)


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with the launcher's defaults filled in."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launcher", choices=("sim", "netns"), default="sim")
    parser.add_argument("--profile", default="paper-cap-td1")
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[10.0, 150.0])
    parser.add_argument("--rtt-trace", default="", help="a trace CSV (t_s, rtt_ms from t_s 0, e.g. "
                        "experiments/traces/roaming-de.csv) the link follows instead of --rtt-ms/--segment-s")
    parser.add_argument("--segment-s", type=float, default=None, help="default 6 (sim), 4 (netns: its schedule)")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.9, 0.3])
    parser.add_argument("--alpha-requests", type=int, default=None, help="requests per prompt class, in turn "
                        "(default 12 sim, 6 netns)")
    parser.add_argument("--requests", type=int, default=None, help="default 48 sim, 24 netns")
    parser.add_argument("--tokens", type=int, default=None, help="per request; default 48 sim, 32 netns")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--modes", nargs="+", default=["ar", "sync", "pipelined"])
    parser.add_argument("--gamma-max", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--oracle", choices=("constant", "schedule"), default="constant",
                        help="netns: measure each static arm at each condition held constant (default), or "
                        "estimate the oracle from the static runs under the schedule only (quicker, noisier)")
    parser.add_argument("--schedule-order", choices=("path", "queue"), default=None,
                        help="netns: what the schedule's RTT cuts mean (orchestrator/links.py): path = packets "
                             "after a cut overtake held ones (TCP may time out spuriously), queue = they drain in "
                             "order; default: experiments/adaptive-netns.toml's (queue)")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    parser.add_argument("--save", default="", help="a pickle of every seed's runs and oracle (for analysis)")
    parser.add_argument("--plot", default="", help="a PNG: seed 0's chosen gamma and mode over time")
    args = parser.parse_args(argv)
    sim = args.launcher == "sim"
    if args.rtt_trace and args.segment_s is not None:
        parser.error("--segment-s applies to the --rtt-ms alternation, not to --rtt-trace (its rows are the segments)")
    if sim and args.schedule_order is not None:
        parser.error("--schedule-order applies to netns only (the sim has no packets to reorder)")
    if not sim and args.schedule_order is None:
        from benchmarks.adaptive_netns import EXPERIMENT
        from orchestrator.experiment import load_experiment
        args.schedule_order = load_experiment(EXPERIMENT).link.schedule_order
    for name, on_sim, on_netns in (("segment_s", 6.0, 4.0), ("alpha_requests", 12, 6), ("requests", 48, 24),
                                   ("tokens", 48, 32)):
        if getattr(args, name) is None:
            setattr(args, name, on_sim if sim else on_netns)
    return args


def scenario_of(args: argparse.Namespace) -> Scenario:
    scenario = Scenario(args.rtt_ms, args.segment_s, args.alphas, args.alpha_requests, args.requests, args.tokens,
                        args.prompt_tokens, tuple(args.modes), args.gamma_max)
    if args.rtt_trace:
        scenario.trace, scenario.trace_name = load_rtt_trace(args.rtt_trace), Path(args.rtt_trace).name
        print(f"link: {scenario.trace_name}, {len(scenario.trace)} segments, levels {scenario.levels_ms()} ms "
              f"(the oracle measured at each, with each alpha)", flush=True)
    return scenario


def main(argv=None) -> None:
    args = parse_args(argv)
    sim = args.launcher == "sim"
    scenario = scenario_of(args)
    profile = get_profile(args.profile)
    per_seed, matched = [], []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        if args.launcher == "sim":
            results, (best, split_c, by_prompt) = sim_seed(scenario, profile, seed), sim_oracle(scenario, profile, seed)
            check_netns_oracle(seed, results, best, split_c, scenario)
        else:
            from benchmarks.adaptive_netns import netns_seed
            results, best, by_prompt = netns_seed(scenario, args, seed)
        per_seed.append((results, best))
        matched.append(by_prompt)
    if args.plot:
        plot(per_seed[0][0], scenario, Path(args.plot))
    if args.save:
        import pickle
        Path(args.save).write_bytes(pickle.dumps({"scenario": scenario, "first_seed": args.first_seed,
                                                  "per_seed": per_seed, "matched": matched}))
    if all(matched):
        print_matched(per_seed, matched, scenario, args.first_seed)
    s = summarise(per_seed, scenario, args.first_seed)
    print(" ".join(f"{k}={v:.1f}" for k, v in s.items()) + f" launcher={args.launcher}"
          + ("" if sim else f" schedule_order={args.schedule_order}") + f" goals_met={goals_met(s)}")


if __name__ == "__main__":
    main()
