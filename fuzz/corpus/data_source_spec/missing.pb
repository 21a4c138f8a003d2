
nope.pt