"""`tandem tune`: measure candidate drafters side by side with plain decoding and decide."""
