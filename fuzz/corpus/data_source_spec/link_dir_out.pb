
out/secret.npy