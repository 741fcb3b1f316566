"""dnnctl doctor: probes -> EnvSnapshot; pure rules over the matrix -> Findings."""
