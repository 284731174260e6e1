"""The training loop: rollouts, rewards, ART backend steps, validation and stopping rules."""
