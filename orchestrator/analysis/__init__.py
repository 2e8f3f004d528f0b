"""Analysis (pure over the records): fits, crossovers, bootstrap intervals, capacity, the optimal
gamma, predictions written before the measurements, the paper's tables."""
