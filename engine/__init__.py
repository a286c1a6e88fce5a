"""Tandem's decoding core: sampling, exact acceptance, backends, sessions and the generator."""
