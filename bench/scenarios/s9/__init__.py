"""S9 scale: the service's core at ten thousand users and a hundred engines, on the virtual clock.

The real core (admission, queues, dispatchers, fairness and backend policies, gates: `SteppedCore`) runs in
this process against a model of the simulator's engine (`engine.BatchEngine`) on one virtual clock, with no
sockets and no sleeps, deterministic for a seed (`simulation.Simulation`). Three parts:

- decision cost (`decision_cost`): CPU per admission and per dispatch with 10 to 100,000 users backlogged,
  side by side with the walks over every user and every gate put back (`baseline`), and every fairness
  policy with the D-LPM window off and on and with shared groups, at 10 and 10,000 users;
- a day (`day`): an hour of Zipf users on 100 engines over 3 models, vtc against FIFO on the same arrivals;
- memory (`memory`): resident memory with 100,000 requests queued from 10,000 users, in a fresh process.

`python -m bench.scenarios.s9` runs them and prints the figures (`--quick`: small sizes, seconds);
`python -m bench --scenarios S9` records them with the other scenarios (`scenario`). This file imports
nothing: the memory part's fresh process imports this package and must hold the core alone.
"""
