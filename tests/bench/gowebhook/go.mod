module gpuguard.test/gowebhook

go 1.22
