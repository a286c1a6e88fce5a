"""Model side of Tandem: the catalog of target/draft pairs, the local store, downloads, checks."""
