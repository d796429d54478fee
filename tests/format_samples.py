"""Small hand-written telemetry files the format tests start from."""

ROUTE = (
    b"# route_trace v1\n"
    b"# model=m.gguf arch=qwen3moe n_layer=2 n_expert=4 n_expert_used=2\n"
    b"# layer=0 expert_bytes=1000 dense_bytes=50\n"
    b"turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
    b"0,1,5,0,0,1,0.6,0,1000\n"
    b"0,1,5,0,1,2,0.4,1,0\n"
    b"0,1,6,0,0,3,nan,1,0\n"
)
METRICS = (
    b"# bmoe_metrics v1\n"
    b"# model=m.gguf arch=x n_layer=2\n"
    b"step,steps,wall_ms,io_ms,compute_ms,read_bytes,cache_hit_pct\n"
    b"1,3,10.500,1.000,9.500,100,50.00\n"
    b"2,3,11.000,1.000,10.000,200,-1.00\n"
    b"3,3,12.000,1.000,11.000,300,75.00\n"
    b"# summary tokens=3 s/tok=0.011 tok/s=89.552 cache_hit_pct=75.0\n"
)
COMPUTE = (
    b"# compute_trace v1\n"
    b"turn,phase,step,seq,layer,op,name,wall_ns,majflt\n"
    b"0,1,29,0,-1,GET_ROWS,embd,428500,0\n"
    b"0,1,29,1,0,RMS_NORM,norm-0,19500,0\n"
)
IO = (
    b"# io_trace v1\n"
    b"turn,phase,step,layer,expert,proj,lane,spec,offset,req_bytes,read_bytes,latency_ns\n"
    b"0,1,29,0,87,1,0,0,1526304,65536,69632,416800\n"
    b"0,1,29,0,88,1,1,0,1591840,65536,69632,300782\n"
)
