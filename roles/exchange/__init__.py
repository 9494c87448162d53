"""Page exchange (Presto BinX): output buffers, BinX server and client."""
