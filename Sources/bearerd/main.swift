import BearerdProxy
print("bearerd skeleton")
