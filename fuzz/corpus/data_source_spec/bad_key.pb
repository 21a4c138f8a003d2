
x.safetensorsa,b