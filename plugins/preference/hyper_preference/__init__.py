"""hyper-train-preference: preference training (DPO, SimPO, ORPO) as a plugin."""
