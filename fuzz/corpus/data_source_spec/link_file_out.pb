

secret.npy