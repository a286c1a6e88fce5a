"""Control: how many tokens each round drafts. The policy interface and its `Decision`
(`policy`), the policies by name (`registry`), and the adaptive controller (`controller`) with
its cost model (`costs`), acceptance estimator (`estimator`), constants (`constants`) and what
it learns of a drafter across answers (`evidence`)."""
