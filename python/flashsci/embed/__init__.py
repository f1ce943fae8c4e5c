"""flashsci.embed: FASTA in, embedding shards out (`python -m flashsci.embed`, `flashsci-embed`; see __main__ for the
command line). The pieces: fasta (streaming records, the bad-record rules), models (loading and patching ESM2 and
ProtT5), plan (shards and their dealing to ranks), compute (windows and token-budget batches of a shard), store
(atomic shard files, checksums, index and manifest). Imports torch and transformers when it runs, not on import."""
