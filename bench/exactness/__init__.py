"""The exactness check: speculative sampling must draw from the same distribution as sampling
the target directly. Samples from both, two-sample tests on a few statistics, a negative
control that must fail, and the greedy agreement rate. Everything here returns data."""
