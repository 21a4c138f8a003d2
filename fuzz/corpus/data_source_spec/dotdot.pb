
../outside/secret.npy