"""yolo-bimamba"""
