"""Links: the experiment's link keys, real geography's RTTs, the rows of links.csv, a link schedule
during a point, and its time line."""
