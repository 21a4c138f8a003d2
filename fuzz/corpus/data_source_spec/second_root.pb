
	y.npy