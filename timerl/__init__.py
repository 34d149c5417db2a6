"""timerl: deep RL programs as recurrent tensors."""
