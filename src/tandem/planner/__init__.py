"""`tandem plan`: which layouts fit a model on a machine and how fast each would step,
predicted before anything runs (`profile`: the model measured on the meta device;
`machine`: devices and links; `layouts`: memory and time per layout)."""
