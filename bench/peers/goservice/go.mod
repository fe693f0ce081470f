module retryd.local/goservice

go 1.22
