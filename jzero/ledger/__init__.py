"""The ledger's instruments: reading compiled HLO (collectives, memory, what is gathered at once),
the paper's estimate, GPU targets compiled on a CPU host, and rendering reports as text."""
