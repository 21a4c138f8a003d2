
	x.npy