
x.safetensorsab